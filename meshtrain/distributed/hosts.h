#pragma once
// Which host each rank runs on, and whether a mesh keeps its tensor-parallel axis inside
// hosts. A host is a machine's name together with its network namespace: ranks in separate
// network stacks on one machine (containers, the multi-host tests) are separate hosts.
#include <string>
#include <vector>

#include "meshtrain/distributed/mesh.h"

namespace mt::dist {

// This process's host key: "<hostname>" plus "@net:<inode>" of its network namespace.
std::string host_key();

// Every rank's host display name, by rank of `comm` (collective: call on every rank). Names
// are the host names, made unique ("vm[2]") where two hosts share one.
std::vector<std::string> host_of_ranks(Communicator& comm);

// Display names of host keys (host_key() of each rank, by rank): the host name, numbered
// ("vm[2]") where different keys share one.
std::vector<std::string> host_display_names(const std::vector<std::string>& keys);

// "2 hosts: a (ranks 0-1), b (ranks 2-3)"; "1 host" when all ranks share one.
std::string describe_hosts(const std::vector<std::string>& hosts);

// The groups of ranks along `axis` (ranks that differ only in that coordinate) that span
// more than one host, each as "ranks 0, 2 on a, b"; empty when every group stays inside a
// host. Ranks map to coordinates as `mesh` maps them (Mesh::coords_of).
std::vector<std::string> groups_spanning_hosts(const Mesh& mesh, const std::string& axis,
                                               const std::vector<std::string>& hosts);

}  // namespace mt::dist
