#include "meshtrain/distributed/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>

namespace mt::dist {

namespace {

constexpr int64_t kKeyBytes = 320;

std::string hostname_of(const std::string& key) { return key.substr(0, key.find("@net:")); }

}  // namespace

std::string host_key() {
  char name[256] = {};
  std::string key = gethostname(name, sizeof(name) - 1) == 0 && name[0] ? name : "localhost";
  char link[64] = {};
  if (readlink("/proc/self/ns/net", link, sizeof(link) - 1) > 0) key += std::string("@net:") + link;
  return key.substr(0, size_t(kKeyBytes - 1));
}

std::vector<std::string> host_of_ranks(Communicator& comm) {
  const int n = comm.size();
  // One i32 per character (the communicator moves typed elements, and there is no byte type).
  std::vector<int32_t> mine(static_cast<size_t>(kKeyBytes), 0), all(static_cast<size_t>(kKeyBytes) * size_t(n), 0);
  const std::string key = host_key();
  for (size_t i = 0; i < key.size(); ++i) mine[i] = static_cast<unsigned char>(key[i]);
  if (n == 1) {
    all = mine;
  } else {
    comm.all_gather(mine.data(), all.data(), kKeyBytes, DType::i32);
  }
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) {
    std::string k;
    for (int64_t i = 0; i < kKeyBytes && all[size_t(r) * size_t(kKeyBytes) + size_t(i)] != 0; ++i)
      k += char(all[size_t(r) * size_t(kKeyBytes) + size_t(i)]);
    keys.push_back(k);
  }
  return host_display_names(keys);
}

std::vector<std::string> host_display_names(const std::vector<std::string>& keys) {
  std::map<std::string, std::vector<std::string>> by_name;  // host name -> its keys in rank order
  for (const std::string& k : keys) {
    auto& v = by_name[hostname_of(k)];
    if (std::find(v.begin(), v.end(), k) == v.end()) v.push_back(k);
  }
  std::vector<std::string> names;
  for (const std::string& k : keys) {
    const auto& v = by_name[hostname_of(k)];
    const size_t index = size_t(std::find(v.begin(), v.end(), k) - v.begin());
    names.push_back(v.size() == 1 ? hostname_of(k) : hostname_of(k) + "[" + std::to_string(index + 1) + "]");
  }
  return names;
}

std::string describe_hosts(const std::vector<std::string>& hosts) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (!ranks.count(hosts[r])) order.push_back(hosts[r]);
    ranks[hosts[r]].push_back(int(r));
  }
  if (order.size() <= 1) return "1 host";
  std::string out = std::to_string(order.size()) + " hosts: ";
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int>& rs = ranks[order[i]];
    const bool contiguous = rs.back() - rs.front() + 1 == int(rs.size());
    std::string list;
    if (contiguous && rs.size() > 1) {
      list = std::to_string(rs.front()) + "-" + std::to_string(rs.back());
    } else {
      for (size_t j = 0; j < rs.size(); ++j) list += (j ? "," : "") + std::to_string(rs[j]);
    }
    out += (i ? ", " : "") + order[i] + " (rank" + (rs.size() > 1 ? "s " : " ") + list + ")";
  }
  return out;
}

std::vector<std::string> groups_spanning_hosts(const Mesh& mesh, const std::string& axis,
                                               const std::vector<std::string>& hosts) {
  std::vector<std::string> out;
  if (!mesh.has_axis(axis) || mesh.axis_size(axis) <= 1 || int(hosts.size()) != mesh.size()) return out;
  const size_t position = size_t(std::find(mesh.axis_names().begin(), mesh.axis_names().end(), axis) -
                                 mesh.axis_names().begin());
  // A group: the ranks whose coordinates agree off `axis`, keyed by those coordinates.
  std::map<std::vector<int>, std::vector<int>> groups;
  for (int r = 0; r < mesh.size(); ++r) {
    std::vector<int> key = mesh.coords_of(r);
    key[position] = -1;
    groups[key].push_back(r);
  }
  for (const auto& [key, group] : groups) {
    bool spans = false;
    for (int g : group) spans = spans || hosts[size_t(g)] != hosts[size_t(group[0])];
    if (!spans) continue;
    std::string ranks, where;
    for (size_t k = 0; k < group.size(); ++k) {
      ranks += (k ? ", " : "") + std::to_string(group[k]);
      where += (k ? ", " : "") + hosts[size_t(group[k])];
    }
    out.push_back("ranks " + ranks + " on " + where);
  }
  return out;
}

}  // namespace mt::dist
