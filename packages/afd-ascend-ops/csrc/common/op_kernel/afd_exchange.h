// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the mailbox protocol both kernels run. a2e and e2a
// differ only in who sends (attention a2e, FFN e2a) and who receives (FFN a2e, attention e2a),
// and in how the peers of a call are chosen; everything else is here:
//
//   Send(op, peers, from)       for each peer: wait (bounded) until it took this rank's previous
//                               message out of its slot; copy the rows (and routing) into this
//                               rank's slot in the peer's window; then the header; then the
//                               peer's arrived word = seq + 1.
//   Receive(op, peers, to, n)   for each peer: wait (bounded) until its arrived word shows a
//                               message newer than the last one taken; check the header against
//                               the expected one (op, seq, source, destination, rows when known,
//                               hidden size, dtype, topk, gated, layer); check the counts sum to n;
//                               only then copy every message out (block order) and write each
//                               sender's released word = seq + 1.
//
// Work split. Core 0 (the leader) does all control: waits, header checks, state, status; it
// writes a copy plan into the launch's workspace; every core then copies its share of each
// segment; core 0 finally publishes (send) or releases (receive). Two SyncAll barriers frame the
// copy, on every core, on every path (a failed call runs an empty plan), so no core waits alone.
//
// Bounded waits. One call has t.spinLimit polling rounds for all its waits together (the
// deadline is the call's, as the reference's); each round also reads the host's stop word. A
// wait that runs out writes kStatusTimeout, a stop kStatusStopped: the kernel never hangs.
//
// Errors. The kernel cannot raise: the first failure is recorded (code, peer, values, both
// headers) and written to the status tensor at Finish(); the state is then left as it was
// (nothing is taken or published), and the host refuses every later call on the group.
//
// Memory ordering. A flag never overtakes what it announces: every core drains its copies
// (DrainWrites: PipeBarrier<PIPE_ALL>, then the dsb DataSyncBarrier<MemDsbT::ALL>) before the
// SyncAll that ends a copy; the leader writes the header, drains again, and only then the
// arrived word (every scalar GM access fenced as afd_gm_words.h says). A receiver's released
// word follows its copies out the same way. Whether the dsb also orders MTE writes into a peer's
// HBM is the one assumption left to confirm on hardware (docs/ascend.md, first run).
//
// Window. Init reads the size of the communicator's window (HcclOpResParam::winSize, A3's HCCL
// context) and fails the call with kStatusWindowSize when the mailbox, laid out from the
// tiling's windowBytes (HCCL_BUFFSIZE on the host), would not fit in it.
// AscendC device code; its syntax is checked against the public AscendC headers in CPU-debug
// mode (csrc/README.md); never built for or run on an NPU here.
#pragma once

#include "kernel_operator.h"
#include "lib/hccl/hccl.h"

#include "afd_mailbox.h"
#include "afd_op_tiling.h"
#include "afd_protocol.h"
#include "afd_byte_mover.h"
#include "afd_gm_words.h"

namespace afd {
namespace kernel {

// Expected rows of a receive that takes whatever count the header announces.
constexpr int64_t kAnyRows = -2;

// The peers of one call, in the order their rows lie in the local buffers (block order).
// Filled and read on the leader only.
struct Peers {
    uint32_t count;
    uint32_t index[kMaxPeers];  // peer indices (afd_mailbox.h)
    int64_t rows[kMaxPeers];    // Send: rows to send. Receive: rows expected, or kAnyRows;
                                // then the rows received
};

// Where a call's sections lie locally: rows [n, H], and when gated expert ids int32 [n, topk]
// and scales float32 [n, topk]; the peers' rows follow one another.
struct Buffers {
    GM_ADDR rows;
    GM_ADDR ids;
    GM_ADDR scales;
};

class Exchange {
public:
    // `data` is the launch's tiling, read onto the stack (GET_TILING_DATA_WITH_STRUCT): the
    // Hccl object is initialised from its HCCL tilings with InitV2, which takes a local address
    // (the older Init, which took the tiling's GM address, is deprecated).
    __aicore__ inline void Init(const OpTilingData& data, GM_ADDR state, GM_ADDR status,
                                GM_ADDR workspace, AscendC::TPipe* pipe)
    {
        t_ = data.exchange;
        world_ = World{t_.ffnRanks, t_.attentionRanks, t_.rank};
        window_ = Window{t_.windowBytes, world_.Slots()};
        state_ = reinterpret_cast<__gm__ int64_t*>(state);
        status_ = reinterpret_cast<__gm__ int64_t*>(status);
        plan_ = reinterpret_cast<__gm__ uint64_t*>(AscendC::GetUserWorkspace(workspace));
        stop_ = reinterpret_cast<__gm__ int32_t*>(t_.stopAddr);
        leader_ = AscendC::GetBlockIdx() == 0;
        spins_ = 0;
        segments_ = 0;
        for (uint32_t i = 0; i < kStatusWords; ++i) {
            statusWords_[i] = 0;
        }
        GM_ADDR context = AscendC::GetHcclContext<AscendC::HCCL_GROUP_ID_0>();
        hccl_.InitV2(context, &data);
        // InitV2 goes with SetCcTilingV2; no collective is ever committed on this object.
        hccl_.SetCcTilingV2(offsetof(OpTilingData, mc2CcTiling));
        mover_.Init(pipe);
        if (leader_) {
            CheckWindow(context);
        }
    }

    __aicore__ inline bool IsLeader() const { return leader_; }
    __aicore__ inline const World& GetWorld() const { return world_; }
    __aicore__ inline bool Failed() const { return statusWords_[0] != kStatusOk; }

    // Records a failure (the first one wins); see StatusCode for a, b, c.
    __aicore__ inline void Fail(int64_t code, int64_t peer, int64_t a, int64_t b, int64_t c)
    {
        if (Failed()) {
            return;
        }
        statusWords_[0] = code;
        statusWords_[1] = peer;
        statusWords_[2] = a;
        statusWords_[3] = b;
        statusWords_[4] = c;
    }

    // An attention rank's only peer (its FFN rank), with `rows` rows.
    __aicore__ inline void OnlyPeer(int64_t rows, Peers* peers) const
    {
        peers->count = 1;
        peers->index[0] = 0;
        peers->rows[0] = rows;
    }

    // Leader: zero this rank's control words (the group's reset, once, before any exchange).
    __aicore__ inline void Reset()
    {
        if (!leader_ || Failed()) {
            return;
        }
        for (uint32_t i = 0; i < world_.Slots(); ++i) {
            StoreWord(At<uint32_t>(Mine(), window_.ArrivedOffset(i)), 0u);
            StoreWord(At<uint32_t>(Mine(), window_.ReleasedOffset(i)), 0u);
        }
    }

    // Every core calls it; `peers` and `from` are read on the leader.
    __aicore__ inline void Send(uint32_t op, const Peers& peers, const Buffers& from)
    {
        if (leader_) {
            if (!Failed()) {
                PlanSend(op, peers, from);
            }
            PublishPlan();
        }
        RunPlan();
        if (leader_ && !Failed()) {
            CommitSend(op, peers);
        }
    }

    // Every core calls it; the leader fills peers.rows with the rows received. `totalRows`:
    // what they must sum to (kAnyRows: anything).
    __aicore__ inline void Receive(uint32_t op, Peers& peers, const Buffers& to, int64_t totalRows)
    {
        if (leader_) {
            if (!Failed()) {
                PlanReceive(op, peers, to, totalRows);
            }
            PublishPlan();
        }
        RunPlan();
        if (leader_ && !Failed()) {
            CommitReceive(peers);
        }
    }

    // Leader: write the status (kStatusOk or the first failure) for the host to check.
    __aicore__ inline void Finish()
    {
        if (leader_) {
            StoreWords(status_, statusWords_, kStatusWords);
        }
    }

private:
    // Fails the call unless the communicator's window holds the mailbox the tiling laid out.
    // HcclOpResParam is the layout of the HCCL context on A3, the only SoC built (afd_socs.h).
    __aicore__ inline void CheckWindow(GM_ADDR context)
    {
        auto resources = reinterpret_cast<__gm__ AscendC::HcclContextDef::HcclOpResParam*>(context);
        uint64_t deviceBytes = LoadWord(&resources->winSize);
        if (deviceBytes < t_.windowBytes) {
            Fail(kStatusWindowSize, -1, static_cast<int64_t>(t_.windowBytes),
                 static_cast<int64_t>(deviceBytes), 0);
        }
    }

    __aicore__ inline GM_ADDR Mine() { return hccl_.GetWindowsInAddr(t_.rank); }
    __aicore__ inline GM_ADDR Theirs(uint32_t worldRank)
    {
        return hccl_.GetWindowsInAddr(worldRank);
    }

    __aicore__ inline __gm__ int64_t* State(StateField field, uint32_t peer)
    {
        return state_ + StateIndex(field, peer, world_.Slots());
    }

    __aicore__ inline void FailHeader(int64_t peer, bool anyRows, const Header& got,
                                      const Header& expected)
    {
        Fail(kStatusHeaderMismatch, peer, anyRows ? 1 : 0, 0, 0);
        PackHeader(got, kStatusReceivedHeader);
        PackHeader(expected, kStatusExpectedHeader);
    }

    __aicore__ inline void PackHeader(const Header& header, uint32_t at)
    {
        uint32_t words[kHeaderWords];
        EncodeHeader(header, words);
        for (uint32_t i = 0; i < kHeaderWords / 2; ++i) {
            uint64_t low = words[2 * i];
            uint64_t high = words[2 * i + 1];
            statusWords_[at + i] = static_cast<int64_t>(low | (high << 32));
        }
    }

    __aicore__ inline Header LoadHeader(GM_ADDR slot)
    {
        uint32_t words[kHeaderWords];
        LoadWords(At<uint32_t>(slot, 0), words, kHeaderWords);
        return DecodeHeader(words);
    }

    __aicore__ inline void StoreHeader(GM_ADDR slot, const Header& header)
    {
        uint32_t words[kHeaderWords];
        EncodeHeader(header, words);
        StoreWords(At<uint32_t>(slot, 0), words, kHeaderWords);
    }

    // Polls `word` until it equals `value` (untilEqual) or differs from it, within the call's
    // spin budget and unless the host sets the stop word. On failure records kStatusTimeout or
    // kStatusStopped with what was waited for (kind, the message's seq and op) and returns false.
    __aicore__ inline bool WaitWord(__gm__ uint32_t* word, uint32_t value, bool untilEqual,
                                    int64_t kind, int64_t peer, int64_t seq, uint32_t op)
    {
        while (true) {
            uint32_t now = LoadWord(word);
            if (untilEqual ? now == value : now != value) {
                return true;
            }
            if (stop_ != nullptr && LoadWord(stop_) != 0) {
                Fail(kStatusStopped, peer, kind, seq, op);
                return false;
            }
            if (++spins_ >= t_.spinLimit) {
                Fail(kStatusTimeout, peer, kind, seq, op);
                return false;
            }
        }
    }

    // One plan segment per non-empty section: local buffer <-> the slot, at row `firstRow`.
    __aicore__ inline void AddSections(const Buffers& local, uint64_t firstRow, uint64_t rows,
                                       GM_ADDR slot, const MessageLayout& m, bool toSlot)
    {
        uint64_t routingRowBytes = static_cast<uint64_t>(t_.topk) * 4;
        AddSegment(local.rows + firstRow * t_.rowBytes, slot + m.rowsOffset, rows * t_.rowBytes,
                   toSlot);
        if (t_.gated != 0) {
            AddSegment(local.ids + firstRow * routingRowBytes, slot + m.idsOffset,
                       rows * routingRowBytes, toSlot);
            AddSegment(local.scales + firstRow * routingRowBytes, slot + m.scalesOffset,
                       rows * routingRowBytes, toSlot);
        }
    }

    __aicore__ inline void AddSegment(GM_ADDR local, GM_ADDR slot, uint64_t bytes, bool toSlot)
    {
        if (bytes == 0) {
            return;
        }
        uint64_t segment[kPlanSegmentWords] = {
            reinterpret_cast<uint64_t>(toSlot ? local : slot),
            reinterpret_cast<uint64_t>(toSlot ? slot : local), bytes};
        StoreWords(plan_ + kPlanHeadWords + segments_ * kPlanSegmentWords, segment,
                   kPlanSegmentWords);
        ++segments_;
    }

    __aicore__ inline void PlanSend(uint32_t op, const Peers& peers, const Buffers& from)
    {
        uint64_t firstRow = 0;
        for (uint32_t j = 0; j < peers.count; ++j) {
            uint32_t i = peers.index[j];
            uint32_t peer = world_.PeerWorldRank(i);
            uint64_t rows = static_cast<uint64_t>(peers.rows[j]);
            MessageLayout m = LayoutMessage(rows, t_.rowBytes, t_.topk, t_.gated != 0);
            if (m.totalBytes > window_.SlotBytes()) {
                Fail(kStatusTooLarge, peer, m.totalBytes, window_.SlotBytes(), 1);
                return;
            }
            int64_t sent = LoadWord(State(kStateSent, i));
            if (sent != 0 &&
                !WaitWord(At<uint32_t>(Mine(), window_.ReleasedOffset(i)),
                          static_cast<uint32_t>(sent), true, kWaitRelease, peer, sent - 1, op)) {
                return;
            }
            GM_ADDR slot = Theirs(peer) + window_.SlotOffset(world_.IndexAtPeer());
            AddSections(from, firstRow, rows, slot, m, true);
            firstRow += rows;
        }
    }

    __aicore__ inline void PlanReceive(uint32_t op, Peers& peers, const Buffers& to,
                                       int64_t totalRows)
    {
        // Every header first, then the copies: a mispaired peer is reported as such.
        int64_t sum = 0;
        for (uint32_t j = 0; j < peers.count; ++j) {
            uint32_t i = peers.index[j];
            uint32_t peer = world_.PeerWorldRank(i);
            int64_t seq = LoadWord(State(kStateCalls, i));
            int64_t taken = LoadWord(State(kStateTaken, i));
            if (!WaitWord(At<uint32_t>(Mine(), window_.ArrivedOffset(i)),
                          static_cast<uint32_t>(taken), false, kWaitArrival, peer, seq, op)) {
                return;
            }
            bool anyRows = peers.rows[j] == kAnyRows;
            Header expected = MakeHeader(op, t_.dtype, static_cast<uint64_t>(seq), peer, t_.rank,
                                         anyRows ? 0u : static_cast<uint32_t>(peers.rows[j]),
                                         t_.hiddenSize, t_.topk, t_.gated != 0);
            Header got = LoadHeader(Mine() + window_.SlotOffset(i));
            if (!IsWellFormed(got) || HeaderDifferences(got, expected, anyRows) != 0) {
                FailHeader(peer, anyRows, got, expected);
                return;
            }
            MessageLayout m = LayoutMessage(got.rows, t_.rowBytes, t_.topk, t_.gated != 0);
            if (m.totalBytes > window_.SlotBytes()) {
                Fail(kStatusTooLarge, peer, m.totalBytes, window_.SlotBytes(), 2);
                return;
            }
            peers.rows[j] = got.rows;
            sum += got.rows;
        }
        if (totalRows != kAnyRows && sum != totalRows) {
            Fail(kStatusCountSum, -1, sum, totalRows, 0);
            return;
        }
        uint64_t firstRow = 0;
        for (uint32_t j = 0; j < peers.count; ++j) {
            uint32_t i = peers.index[j];
            uint64_t rows = static_cast<uint64_t>(peers.rows[j]);
            MessageLayout m = LayoutMessage(rows, t_.rowBytes, t_.topk, t_.gated != 0);
            AddSections(to, firstRow, rows, Mine() + window_.SlotOffset(i), m, false);
            firstRow += rows;
        }
    }

    // Leader: the plan's head (go unless failed, the segment count) after its segments.
    __aicore__ inline void PublishPlan()
    {
        uint64_t head[kPlanHeadWords] = {Failed() ? 0ull : 1ull, Failed() ? 0ull : segments_};
        StoreWords(plan_, head, kPlanHeadWords);
    }

    // Every core: copy its share of each segment of the plan, between two barriers.
    __aicore__ inline void RunPlan()
    {
        AscendC::SyncAll();  // the leader's plan is in the workspace
        uint64_t head[kPlanHeadWords];
        LoadWords(plan_, head, kPlanHeadWords);
        uint64_t cores = AscendC::GetBlockNum();
        uint64_t core = AscendC::GetBlockIdx();
        for (uint64_t s = 0; head[0] == 1 && s < head[1]; ++s) {
            uint64_t segment[kPlanSegmentWords];
            LoadWords(plan_ + kPlanHeadWords + s * kPlanSegmentWords, segment, kPlanSegmentWords);
            uint64_t bytes = segment[2];
            uint64_t share = AlignUp((bytes + cores - 1) / cores, kAlign);
            uint64_t begin = core * share;
            if (begin < bytes) {
                uint64_t end = begin + share < bytes ? begin + share : bytes;
                mover_.Copy(reinterpret_cast<GM_ADDR>(segment[1]) + begin,
                            reinterpret_cast<GM_ADDR>(segment[0]) + begin, end - begin);
            }
        }
        DrainWrites();  // this core's copies have reached memory before any flag is written
        AscendC::SyncAll();
    }

    // Leader, after the copies (drained on every core): header, drain, then the arrived word,
    // for each peer; then the state.
    __aicore__ inline void CommitSend(uint32_t op, const Peers& peers)
    {
        uint32_t atPeer = world_.IndexAtPeer();
        for (uint32_t j = 0; j < peers.count; ++j) {
            uint32_t i = peers.index[j];
            uint32_t peer = world_.PeerWorldRank(i);
            int64_t seq = LoadWord(State(kStateCalls, i));
            StoreHeader(Theirs(peer) + window_.SlotOffset(atPeer),
                        MakeHeader(op, t_.dtype, static_cast<uint64_t>(seq), t_.rank, peer,
                                   static_cast<uint32_t>(peers.rows[j]), t_.hiddenSize, t_.topk,
                                   t_.gated != 0));
            DrainWrites();  // the header before the word that announces it
            StoreWord(At<uint32_t>(Theirs(peer), window_.ArrivedOffset(atPeer)),
                      static_cast<uint32_t>(seq + 1));
            StoreWord(State(kStateSent, i), seq + 1);
            StoreWord(State(kStateCalls, i), seq + 1);
        }
    }

    // Leader, after the copies: tell each sender its slot is free again; then the state.
    __aicore__ inline void CommitReceive(const Peers& peers)
    {
        uint32_t atPeer = world_.IndexAtPeer();
        for (uint32_t j = 0; j < peers.count; ++j) {
            uint32_t i = peers.index[j];
            int64_t seq = LoadWord(State(kStateCalls, i));
            StoreWord(At<uint32_t>(Theirs(world_.PeerWorldRank(i)), window_.ReleasedOffset(atPeer)),
                      static_cast<uint32_t>(seq + 1));
            StoreWord(State(kStateTaken, i), seq + 1);
            StoreWord(State(kStateCalls, i), seq + 1);
        }
    }

    ExchangeTiling t_;
    World world_;
    Window window_;
    __gm__ int64_t* state_;
    __gm__ int64_t* status_;
    __gm__ uint64_t* plan_;
    __gm__ int32_t* stop_;
    bool leader_;
    uint64_t spins_;
    uint64_t segments_;
    int64_t statusWords_[kStatusWords];
    AscendC::Hccl<AscendC::HcclServerType::HCCL_SERVER_TYPE_AICPU> hccl_;
    ByteMover mover_;
};

}  // namespace kernel
}  // namespace afd
