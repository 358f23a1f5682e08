#include "meshtrain/distributed/mesh.h"

#include <algorithm>
#include <cctype>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/hosts.h"
#include "meshtrain/distributed/local_communicator.h"
#include "meshtrain/distributed/spmd.h"

namespace mt::dist {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// Each rank's row-major position: ranks grouped by host (hosts in the order of their lowest
// rank), in rank order within a host.
std::vector<int> host_order_positions(const std::vector<std::string>& hosts) {
  std::vector<std::string> order;  // hosts by lowest rank
  for (const std::string& h : hosts)
    if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
  std::vector<int> position(hosts.size());
  int next = 0;
  for (const std::string& h : order)
    for (size_t r = 0; r < hosts.size(); ++r)
      if (hosts[r] == h) position[r] = next++;
  return position;
}

std::string format(const std::vector<std::string>& names, const std::vector<int>& sizes) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i] + "=" + std::to_string(sizes[i]);
  return out;
}

}  // namespace

Mesh::Mesh() : Mesh(single()) {}

Mesh Mesh::single() {
  auto local = std::make_shared<LocalCommunicator>("single");
  Communicator& comm = *local;
  return Mesh({}, {}, comm, std::move(local));
}

Mesh::Mesh(std::vector<std::string> names, std::vector<int> sizes, Communicator& comm,
           std::shared_ptr<Communicator> owned) {
  install_spmd();  // arrays on this mesh run through the distributed executor
  auto s = std::make_shared<State>();
  s->names = std::move(names), s->sizes = std::move(sizes), s->comm = &comm, s->owned_comm = std::move(owned);
  s->hosts = host_of_ranks(comm);  // collective; without communication on one rank
  if (comm.size() > 1) s->position = host_order_positions(s->hosts);
  s->coords = coords_of(*s, comm.rank());
  // Splits run in axis order on every rank, so the collective calls match.
  for (size_t a = 0; a < s->names.size(); ++a) {
    if (s->sizes[a] == 1) {
      s->axis_comms.push_back(std::make_shared<LocalCommunicator>(s->names[a]));
      continue;
    }
    int color = 0;  // linear index of the coordinates without axis a
    for (size_t i = 0; i < s->names.size(); ++i)
      if (i != a) color = color * s->sizes[i] + s->coords[i];
    s->axis_comms.push_back(comm.split(color, s->coords[a], s->names[a]));
  }
  s_ = std::move(s);
}

Mesh Mesh::from_string(const std::string& spec) {
  std::vector<std::string> names;
  std::vector<int> sizes;
  int inferred = -1;
  size_t start = 0;
  while (true) {
    const size_t comma = spec.find(',', start);
    const size_t length = comma == std::string::npos ? std::string::npos : comma - start;
    const std::string item = trim(spec.substr(start, length));
    const size_t eq = item.find('=');
    MT_CHECK(eq != std::string::npos, "[mesh] malformed mesh '", spec,
             "': expected axis=size items separated by commas, e.g. 'data=2,model=2'; got '", item, "'");
    const std::string name = trim(item.substr(0, eq));
    const std::string size_text = trim(item.substr(eq + 1));
    MT_CHECK(is_identifier(name), "[mesh] malformed mesh '", spec, "': axis name '", name,
             "' is not an identifier (letters, digits, _)");
    for (const auto& n : names)
      MT_CHECK(n != name, "[mesh] malformed mesh '", spec, "': axis '", name, "' appears twice");
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(size_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MT_CHECK(used > 0 && used == size_text.size(), "[mesh] malformed mesh '", spec, "': size '", size_text,
             "' of axis '", name, "' is not an integer");
    MT_CHECK(v > 0 || v == -1, "[mesh] mesh '", spec, "': axis '", name, "' has size ", v,
             "; sizes must be positive (or -1 for one inferred axis)");
    MT_CHECK(v <= (1 << 24), "[mesh] mesh '", spec, "': axis '", name, "' size ", v, " is too large");
    if (v == -1) {
      MT_CHECK(inferred < 0, "[mesh] mesh '", spec, "': only one axis may be -1 (inferred), got '",
               names[size_t(inferred)], "' and '", name, "'");
      inferred = int(names.size());
    }
    names.push_back(name);
    sizes.push_back(int(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }

  Communicator& w = world();
  const int world_size = w.size();
  long long known = 1;
  for (int s : sizes)
    if (s > 0) known *= s;
  if (inferred >= 0) {
    MT_CHECK(world_size % known == 0, "[mesh] mesh '", spec, "': the other axes have ", known,
             " devices, which does not divide the world size ", world_size, ", so axis '", names[size_t(inferred)],
             "' cannot be inferred");
    sizes[size_t(inferred)] = int(world_size / known);
  } else {
    MT_CHECK(known == world_size, "[mesh] mesh '", spec, "' has ", known, " devices but the world has ", world_size,
             world_size == 1 ? " rank (launch with mpirun -np " : " ranks (launch with mpirun -np ",
             known, ")");
  }
  return Mesh(std::move(names), std::move(sizes), w);
}

Mesh Mesh::from_model_shards(int n_model_shards) {
  Communicator& w = world();
  MT_CHECK(n_model_shards > 0, "[mesh] n_model_shards must be positive, got ", n_model_shards);
  MT_CHECK(w.size() % n_model_shards == 0, "[mesh] --model-shards ", n_model_shards, " does not divide the ", w.size(),
           " process", w.size() == 1 ? "" : "es", " of this run: launch a multiple of ", n_model_shards,
           ", e.g. mpirun -np ", n_model_shards, " meshtrain ...");
  return Mesh({"data", "model"}, {w.size() / n_model_shards, n_model_shards}, w);
}

int Mesh::size() const {
  int n = 1;
  for (int v : s_->sizes) n *= v;
  return n;
}

int Mesh::axis_position(const std::string& axis) const {
  const auto& names = s_->names;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == axis) return int(i);
  throw Error(::mt::detail::concat("[mesh] unknown axis '", axis, "'; mesh '", str(), "' has ",
                                   names.empty() ? "no axes" : "axes " + detail::join(names)));
}

bool Mesh::has_axis(const std::string& axis) const {
  for (const auto& n : s_->names)
    if (n == axis) return true;
  return false;
}

int Mesh::axis_size(const std::string& axis) const { return s_->sizes[size_t(axis_position(axis))]; }

std::vector<int> Mesh::coords_of(int rank) const {
  MT_CHECK(rank >= 0 && (s_->position.empty() || rank < int(s_->position.size())), "[mesh] no rank ", rank,
           " in mesh ", str());
  return coords_of(*s_, rank);
}

std::vector<int> Mesh::coords_of(const State& s, int rank) {
  // Row-major over the host-ordered positions: the last axis varies fastest.
  if (!s.position.empty()) rank = s.position[size_t(rank)];
  std::vector<int> c(s.names.size(), 0);
  for (size_t i = s.names.size(); i-- > 0;) {
    c[i] = rank % s.sizes[i];
    rank /= s.sizes[i];
  }
  return c;
}

int Mesh::axis_index(const std::string& axis) const { return s_->coords[size_t(axis_position(axis))]; }

Communicator& Mesh::axis_comm(const std::string& axis) const { return *s_->axis_comms[size_t(axis_position(axis))]; }

Communicator& Mesh::comm() const { return *s_->comm; }

std::string Mesh::str() const { return s_->names.empty() ? "single" : format(s_->names, s_->sizes); }

bool Mesh::operator==(const Mesh& other) const {
  return s_ == other.s_ || (s_->names == other.s_->names && s_->sizes == other.s_->sizes);
}

}  // namespace mt::dist
