// Our event files read by independent code: Python parses the TFRecord framing, checks
// both CRCs with crcmod's CRC-32C and decodes each Event with Google's protobuf runtime
// (descriptors built from TensorBoard's event.proto / summary.proto field numbers).
// TensorBoard itself is not packaged by Debian; this is the closest check of its reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "meshtrain/meshtrain.h"
#include "tests/support/torch_oracle.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using namespace mt::train;

// Sets `res` to [n_events, version_ok, then (step, value) per scalar] and raises when a
// CRC fails, a record is truncated or re-serializing an Event does not give its bytes back.
const char* kReader = R"(
import struct, crcmod.predefined
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
crc = crcmod.predefined.mkCrcFun('crc-32c')
def masked(b):
    c = crc(b)
    return ((((c >> 15) | (c << 17)) & 0xffffffff) + 0xa282ead8) & 0xffffffff
F = descriptor_pb2.FieldDescriptorProto
fdp = descriptor_pb2.FileDescriptorProto(name='mt_event_check.proto', package='tbcheck')
ev = fdp.message_type.add(name='Event')
ev.field.add(name='wall_time', number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
ev.field.add(name='step', number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
ev.field.add(name='file_version', number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
ev.field.add(name='summary', number=5, type=F.TYPE_MESSAGE, type_name='.tbcheck.Summary', label=F.LABEL_OPTIONAL)
sm = fdp.message_type.add(name='Summary')
val = sm.nested_type.add(name='Value')
val.field.add(name='tag', number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
val.field.add(name='simple_value', number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
sm.field.add(name='value', number=1, type=F.TYPE_MESSAGE, type_name='.tbcheck.Summary.Value', label=F.LABEL_REPEATED)
pool = descriptor_pool.DescriptorPool()
pool.Add(fdp)
Event = message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName('tbcheck.Event'))
data = open(PATH, 'rb').read()
pos, events = 0, []
while pos < len(data):
    (n,) = struct.unpack_from('<Q', data, pos)
    (len_crc,) = struct.unpack_from('<I', data, pos + 8)
    assert len_crc == masked(data[pos:pos + 8]), 'length crc at %d' % pos
    body = data[pos + 12:pos + 12 + n]
    assert len(body) == n, 'truncated at %d' % pos
    (body_crc,) = struct.unpack_from('<I', data, pos + 12 + n)
    assert body_crc == masked(body), 'data crc at %d' % pos
    e = Event()
    e.ParseFromString(body)
    assert e.SerializeToString() == body, 'non-canonical Event at %d' % pos
    events.append(e)
    pos += 12 + n + 4
res = [len(events), float(events[0].file_version == 'brain.Event:2' and not events[0].HasField('summary'))]
tags = []
for e in events[1:]:
    for v in e.summary.value:
        tags.append(v.tag)
        res += [e.step, v.simple_value]
assert tags == TAGS, tags
)";

TEST(TensorBoardOracle, ProtobufAndCrcmodReadOurEvents) {
  fs::path dir = fs::temp_directory_path() / ("mt_tb_oracle_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::string path;
  std::vector<std::string> tags;
  std::vector<double> expected;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    for (int64_t s = 0; s < 20; ++s) {
      w.scalar("train/loss", 4.0 - 0.1 * double(s), s * 7);
      tags.push_back("train/loss");
      expected.push_back(double(s * 7));
      expected.push_back(double(float(4.0 - 0.1 * double(s))));
    }
    w.scalar("unicode/ünï", -3.5e-5, int64_t(1) << 35);
    tags.push_back("unicode/ünï");
    expected.push_back(double(int64_t(1) << 35));
    expected.push_back(double(float(-3.5e-5)));
    w.write(ScalarRecord{200, "eval", {{"accuracy", 0.8125}, {"matthews_correlation", -0.25}}});
    for (const char* name : {"eval/accuracy", "eval/matthews_correlation"}) tags.push_back(name);
    expected.insert(expected.end(), {200, 0.8125, 200, -0.25});
  }
  std::string tag_list = "[";
  for (const auto& t : tags) tag_list += "'" + t + "',";
  tag_list += "]";
  std::string code = "PATH = '" + path + "'\nTAGS = " + tag_list + "\n" + kReader +
                     "\nout = torch.tensor(res, dtype=torch.float64)\n";
  auto res = TorchOracle::instance().run(code, {}).outputs.at(0).data;
  ASSERT_EQ(res.size(), 2 + expected.size());
  EXPECT_EQ(res[0], 23.0);  // version event + 21 scalar events + 1 record event
  EXPECT_EQ(res[1], 1.0);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(res[2 + i], expected[i]) << i;
  std::printf("python protobuf + crcmod decoded %zu scalars from %s, all equal\n", expected.size() / 2, path.c_str());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt::testing
