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
  const std::vector<std::string>& axis_names() const { return names_; }
  int axis_size(const std::string& axis) const;
  int axis_index(const std::string& axis) const;  // this rank's coordinate along `axis`
  bool has_axis(const std::string& axis) const;
  const std::vector<int>& coords() const { return coords_; }  // this rank's coordinates, axis order
  std::vector<int> coords_of(int rank) const;                 // any rank's, axis order
  int rank() const { return comm().rank(); }                  // this rank in comm()
  // Every rank's host display name, by rank (dist/hosts.h; gathered when the mesh is made).
  const std::vector<std::string>& hosts() const { return hosts_; }

  Communicator& axis_comm(const std::string& axis) const;  // ranks that differ only along `axis`
  Communicator& comm() const;                              // all ranks of the mesh
  std::string str() const;                                 // "data=2,model=2"; "single" for no axes
  layout::MeshShape shape() const { return {names_, sizes_}; }  // axes and sizes, for sharding rules
  bool operator==(const Mesh& other) const;                // same axes and sizes
  bool operator!=(const Mesh& other) const { return !(*this == other); }

 private:
  // Builds the axis communicators by splitting `comm` (its rank gives the coordinates).
  Mesh(std::vector<std::string> names, std::vector<int> sizes, Communicator& comm);
  int axis_position(const std::string& axis) const;  // throws naming the axis and the existing ones

  std::vector<std::string> names_;
  std::vector<int> sizes_;
  std::vector<int> coords_;
  std::vector<std::string> hosts_;
  std::vector<int> position_;  // rank -> its row-major position (empty: the rank itself)
  // Shared by copies. comm_ is world() (never destroyed) or owned through owned_comm_.
  Communicator* comm_ = nullptr;
  std::shared_ptr<Communicator> owned_comm_;
  std::vector<std::shared_ptr<Communicator>> axis_comms_;
};

}  // namespace mt::dist
