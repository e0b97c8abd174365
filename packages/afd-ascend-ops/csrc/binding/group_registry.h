// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): what the binding keeps per group name (group_ep,
// the HCCL communicator name an NPU op provider returned for one stage), process-local:
//
//   world      F, A and this rank's world rank the group was opened for (every call must match)
//   state      device int64 [3 * ceil(A/F)], zeroed at open: the kernels' sequence numbers per
//              peer (common/afd_mailbox.h), so seq is per (group, peer) as in the reference
//   stop word  an int32 in page-locked host memory mapped into the device's address space
//              (aclrtHostRegister): interrupt() stores 1 with a plain atomic store; a kernel
//              polling any wait reads it every round and ends with kStatusStopped
//   timeout    bounds every call (the kernels' spin limit is derived from it)
//   core cap   with several stages, the vector cores one call may use: the device's vector cores
//              divided by the stages, so the kernels of every stage fit on the device at once
//              (each spins in SyncAll until all its cores run; two that each took every core,
//              on two streams, could wait on each other for ever, as CANN's SyncAll page warns)
//   pending    attention: rows of the a2e that awaits its e2a (-1: none)
//   fault      the first error of a call on the group; every later call repeats it (the
//              message stream can no longer be trusted), as the reference's fuse
//
// A name that was closed stays known, so a late call says "closed", not "unknown". Stop words
// are never freed: a kernel launched before close() may still read one; a closed group costs
// one page of host memory until the process ends.
// Host C++17 with the ACL runtime headers of the torch-npu wheel.
#pragma once

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "acl/acl_rt.h"

#include "afd_mailbox.h"

namespace afd {
namespace binding {

// One stop word, host-mapped (see the file comment).
class StopWord {
public:
    StopWord()
    {
        static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t), "the kernel reads an int32");
        host_ = std::aligned_alloc(kPage, kPage);
        TORCH_CHECK(host_ != nullptr, "afd_ascend: cannot allocate the stop word of a group");
        word_ = new (host_) std::atomic<int32_t>(0);
        aclError error = aclrtHostRegister(host_, kPage, ACL_HOST_REGISTER_MAPPED, &device_);
        TORCH_CHECK(error == ACL_SUCCESS, "afd_ascend: aclrtHostRegister of a group's stop word "
                    "failed with ACL error ", error, "; the NPU runtime cannot map host memory "
                    "for the device (check the CANN and driver versions)");
    }
    StopWord(const StopWord&) = delete;
    StopWord& operator=(const StopWord&) = delete;

    void Set() { word_->store(1, std::memory_order_seq_cst); }
    // The address the kernels read (the stop_addr attribute).
    int64_t DeviceAddress() const
    {
        return static_cast<int64_t>(reinterpret_cast<uintptr_t>(device_));
    }

private:
    static constexpr size_t kPage = 4096;
    void* host_ = nullptr;
    void* device_ = nullptr;
    std::atomic<int32_t>* word_ = nullptr;
};

struct Group {
    std::string name;  // also the group_ep string handed to aclnn (must outlive each call)
    World world;
    double timeoutS;
    at::Tensor state;
    std::shared_ptr<StopWord> stop = std::make_shared<StopWord>();
    std::mutex calls;        // one call at a time on a group; interrupt() does not take it
    int64_t pendingRows = -1;
    int64_t coreCap = 0;     // 0: no cap (one stage)
    std::string fault;
    std::atomic<bool> interrupted{false};

    int64_t TimeoutMs() const { return static_cast<int64_t>(timeoutS * 1000.0 + 0.5); }
    // The aiv_num a call passes to the kernel for the aiv_num it was given (0: every core).
    int64_t AivNum(int64_t requested) const
    {
        if (coreCap == 0) {
            return requested;
        }
        return requested > 0 && requested < coreCap ? requested : coreCap;
    }
};

class Registry {
public:
    static Registry& Get()
    {
        static Registry registry;
        return registry;
    }

    // Adds a group; a name in use (or used before) is an error.
    void Add(const std::shared_ptr<Group>& group)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        TORCH_CHECK(groups_.count(group->name) == 0 && closed_.count(group->name) == 0,
                    "afd_ascend: the group name '", group->name, "' is already taken");
        groups_[group->name] = group;
    }

    // The group of `name`; AFDShutdown once closed, UnknownGroupError when never opened here.
    std::shared_ptr<Group> Lookup(const std::string& name)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = groups_.find(name);
        TORCH_CHECK(found != groups_.end(),
                    closed_.count(name) != 0 ? Closed(name) : Unknown(name));
        return found->second;
    }

    // Sets the stop word (a blocked kernel ends within one polling round) and refuses later
    // calls. Idempotent; a closed or unknown name is left alone.
    void Interrupt(const std::string& name)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = groups_.find(name);
        if (found != groups_.end()) {
            found->second->interrupted = true;
            found->second->stop->Set();
        }
    }

    // Interrupts and forgets the group; later calls raise AFDShutdown. Idempotent.
    void Close(const std::string& name)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = groups_.find(name);
        if (found == groups_.end()) {
            return;
        }
        found->second->interrupted = true;
        found->second->stop->Set();
        retired_.push_back(found->second->stop);  // stays mapped (see the file comment)
        groups_.erase(found);
        closed_.insert(name);
    }

private:
    static std::string Closed(const std::string& name)
    {
        return "[AFDShutdown] afd_ascend: the group '" + name +
               "' was closed (its op provider is closed)";
    }

    static std::string Unknown(const std::string& name)
    {
        return "[UnknownGroupError] afd_ascend: no NPU group '" + name +
               "' in this process; open it with afd_ascend_ops._C.open_group (the NPU op "
               "provider's open does) before calling a2e/e2a on NPU tensors";
    }

    std::mutex mutex_;
    std::unordered_map<std::string, std::shared_ptr<Group>> groups_;
    std::unordered_set<std::string> closed_;
    std::vector<std::shared_ptr<StopWord>> retired_;
};

}  // namespace binding
}  // namespace afd
