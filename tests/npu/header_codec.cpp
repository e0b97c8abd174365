// The compiled header codec of csrc/common/afd_protocol.h, driven by
// tests/npu/test_protocol_header.py (which builds it with g++).
//
//   header_codec encode OP DTYPE SEQ SOURCE DESTINATION ROWS HIDDEN TOPK GATED LAYER
//       prints the 64-byte header as 128 hex digits (byte order of the wire)
//   header_codec decode HEX
//       prints "magic version op dtype seq source destination rows hidden topk flags layer"
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "afd_protocol.h"

namespace {

uint64_t Arg(char** argv, int i) { return std::strtoull(argv[i], nullptr, 0); }

int Encode(char** argv)
{
    afd::Header h = afd::MakeHeader(
        static_cast<uint32_t>(Arg(argv, 2)), static_cast<uint32_t>(Arg(argv, 3)), Arg(argv, 4),
        static_cast<uint32_t>(Arg(argv, 5)), static_cast<uint32_t>(Arg(argv, 6)),
        static_cast<uint32_t>(Arg(argv, 7)), static_cast<uint32_t>(Arg(argv, 8)),
        static_cast<uint32_t>(Arg(argv, 9)), Arg(argv, 10) != 0);
    h.layer = static_cast<uint32_t>(Arg(argv, 11));
    uint32_t words[afd::kHeaderWords];
    afd::EncodeHeader(h, words);
    for (uint32_t i = 0; i < afd::kHeaderWords; ++i) {
        for (int b = 0; b < 4; ++b) {
            std::printf("%02x", (words[i] >> (8 * b)) & 0xFFu);
        }
    }
    std::printf("\n");
    return 0;
}

int Decode(const char* hex)
{
    if (std::strlen(hex) != 2 * afd::kHeaderBytes) {
        return 2;
    }
    uint32_t words[afd::kHeaderWords] = {};
    for (uint32_t i = 0; i < afd::kHeaderBytes; ++i) {
        char byte[3] = {hex[2 * i], hex[2 * i + 1], 0};
        words[i / 4] |= static_cast<uint32_t>(std::strtoul(byte, nullptr, 16)) << (8 * (i % 4));
    }
    afd::Header h = afd::DecodeHeader(words);
    std::printf("%u %u %u %u %llu %u %u %u %u %u %u %u\n", h.magic, h.version, h.op, h.dtype,
                static_cast<unsigned long long>(h.seq), h.source, h.destination, h.rows, h.hidden,
                h.topk, h.flags, h.layer);
    return 0;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc == 12 && std::strcmp(argv[1], "encode") == 0) {
        return Encode(argv);
    }
    if (argc == 3 && std::strcmp(argv[1], "decode") == 0) {
        return Decode(argv[2]);
    }
    std::fprintf(stderr, "usage: header_codec encode OP DTYPE SEQ SOURCE DESTINATION ROWS "
                         "HIDDEN TOPK GATED LAYER | decode HEX\n");
    return 2;
}
