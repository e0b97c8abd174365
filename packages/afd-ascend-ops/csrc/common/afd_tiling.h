// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the arguments one a2e or e2a launch hands its
// kernel, filled by the op_host tiling functions and read by the kernels. Plain data, the same
// layout on host and device; the CANN parts of the tiling data are added in afd_op_tiling.h.
#pragma once

#include "afd_mailbox.h"

namespace afd {

// What the launch does: the exchange, or (a2e only) zeroing this rank's mailbox control words
// once when the group opens (the host then runs a barrier on the group before any exchange).
enum Mode : uint32_t { kModeExchange = 0, kModeReset = 1 };

// The assumed cost of one polling round (one control word and the stop word read through the
// data cache, about 1 us): a wait's spin limit is timeout / this. Measure it on hardware.
constexpr uint64_t kEstimatedPollNs = 1000;

// The copy plan core 0 hands the other cores through the launch's user workspace: a go word,
// a segment count, then (source address, destination address, bytes) per segment; at most
// three segments (rows, expert ids, scales) per peer.
constexpr uint32_t kPlanHeadWords = 2;
constexpr uint32_t kPlanSegmentWords = 3;
constexpr uint32_t kPlanMaxSegments = 3 * kMaxPeers;
constexpr uint64_t kPlanBytes = 8ull * (kPlanHeadWords + kPlanSegmentWords * kPlanMaxSegments);

struct ExchangeTiling {
    uint32_t ffnRanks;        // F (expert_rank_size)
    uint32_t attentionRanks;  // A (attention_rank_size)
    uint32_t rank;            // this rank's world rank, FFN first
    uint32_t mode;            // Mode
    uint32_t batchSize;       // FFN: the rows its block sends in total (a2e) / it returns (e2a)
    uint32_t rows;            // rows of the op's row input (x of a2e, expand_x of e2a)
    uint32_t hiddenSize;      // H
    uint32_t rowBytes;        // H * the element size
    uint32_t dtype;           // the rows' wire dtype code (afd_protocol.h)
    uint32_t topk;
    uint32_t gated;           // 1: expert ids and scales travel with the rows (a2e)
    uint32_t hasExpected;     // FFN a2e: expert_ids holds the rows expected per block member
    uint64_t spinLimit;       // polling rounds one call may spend waiting, all waits together
    uint64_t stopAddr;        // device address of the host-mapped stop word (int32, 0: run)
    uint64_t windowBytes;     // the HCCL window ("windows in") size of every rank
};

}  // namespace afd
