#pragma once
// The MPI backend of Communicator (the class itself lives in mpi_communicator.cpp, so mpi.h
// stays out of headers). Every MPI call runs on MpiRuntime's communication thread.
#include <memory>

#include "meshtrain/distributed/communicator.h"

namespace mt::dist::internal {

// A duplicate of MPI_COMM_WORLD named "world"; starts MPI on first use.
std::unique_ptr<Communicator> make_mpi_world_communicator();

}  // namespace mt::dist::internal
