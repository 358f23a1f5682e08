#pragma once
// Mesh: named axes over all ranks, e.g. data=2,model=2. Ranks map to coordinates row-major in
// host order (the last axis varies fastest): the ranks of one host come first, in rank order,
// then the next host's (hosts in the order of their lowest rank). So the last axis — `model`
// — stays inside a host whenever hosts run whole groups of it, however the launcher numbered
// the ranks (mpirun --map-by node deals consecutive ranks to different hosts). With every
// host's ranks contiguous (mpirun's default) this is plain rank order. Each axis has a
// sub-communicator over the ranks that differ only along it.
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/distributed/communicator.h"
#include "meshtrain/layout/mesh_shape.h"

namespace mt::dist {

class Mesh {
 public:
  Mesh();  // single()

  // "data=2,model=2"; one axis may be -1 (inferred from the world size). Collective over the
  // world (it creates the axis communicators): call it on every rank in the same order.
  static Mesh from_string(const std::string& spec);
  // data = world / n_model_shards, model = n_model_shards.
  static Mesh from_model_shards(int n_model_shards);
  // One device and no axes: this process alone, whatever the world size.
  static Mesh single();

  int size() const;  // product of the axis sizes (== world size, except single())
  const std::vector<std::string>& axis_names() const { return s_->names; }
  int axis_size(const std::string& axis) const;
  int axis_index(const std::string& axis) const;  // this rank's coordinate along `axis`
  bool has_axis(const std::string& axis) const;
  const std::vector<int>& coords() const { return s_->coords; }  // this rank's coordinates, axis order
  std::vector<int> coords_of(int rank) const;                 // any rank's, axis order
  int rank() const { return comm().rank(); }                  // this rank in comm()
  // Every rank's host display name, by rank (dist/hosts.h; gathered when the mesh is made).
  const std::vector<std::string>& hosts() const { return s_->hosts; }

  Communicator& axis_comm(const std::string& axis) const;  // ranks that differ only along `axis`
  Communicator& comm() const;                              // all ranks of the mesh
  std::string str() const;                                 // "data=2,model=2"; "single" for no axes
  layout::MeshShape shape() const { return {s_->names, s_->sizes}; }  // axes and sizes, for sharding rules
  bool operator==(const Mesh& other) const;                // same axes and sizes
  bool operator!=(const Mesh& other) const { return !(*this == other); }

 private:
  // Builds the axis communicators by splitting `comm` (its rank gives the coordinates).
  // `owned` keeps a communicator made for this mesh alive (single()).
  Mesh(std::vector<std::string> names, std::vector<int> sizes, Communicator& comm,
       std::shared_ptr<Communicator> owned = nullptr);
  int axis_position(const std::string& axis) const;  // throws naming the axis and the existing ones

  // Immutable once built, and shared by copies: every distributed array's Sharding holds a
  // Mesh, and copying the vectors cost ~10 allocations per copy (9.8 million in two FSDP steps
  // of GPT-2 Large).
  struct State {
    std::vector<std::string> names;
    std::vector<int> sizes;
    std::vector<int> coords;
    std::vector<std::string> hosts;
    std::vector<int> position;  // rank -> its row-major position (empty: the rank itself)
    // comm is world() (never destroyed) or owned through owned_comm.
    Communicator* comm = nullptr;
    std::shared_ptr<Communicator> owned_comm;
    std::vector<std::shared_ptr<Communicator>> axis_comms;
  };
  static std::vector<int> coords_of(const State& s, int rank);
  std::shared_ptr<const State> s_;
};

}  // namespace mt::dist
