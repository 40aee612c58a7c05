// TrainrunCollective: one collective of a graph (tf.function, TF1 session) as one asynchronous kernel.
//
// The kernel hands the op's buffers to trainrun's runtime through one registered callback (Python,
// graph_ops.py: a ctypes function, so the crossing is one C call that takes the GIL, with no
// numpy_function node, no tensor <-> NumPy conversion and no copy of the result) and returns at once:
// no TensorFlow thread waits while the collective is in flight. The runtime completes it later from
// its waiter thread with trainrun_complete(id, code, message), or within the callback (the runtime
// ran a lone collective to completion at once); either way the kernel's done callback runs once, after
// the callback returned, with TensorFlow's error code for a failure (Horovod's error types).
//
// Two shapes of op (attr `in_place`):
//  * in place (allreduce, grouped allreduce, broadcast: every output has its input's shape and dtype):
//    the outputs are prepared before the callback and the runtime works in them. One input forwards
//    its buffer to the output where TensorFlow allows it (nobody else holds it) and is copied
//    otherwise, and is handed with its shape (the ranks' shapes are compared); several inputs of one
//    dtype are copied into one fused buffer, at 64-byte-aligned offsets, and each output is a view of
//    its part: the runtime reduces one flat buffer (one negotiation, one MPI call; the ranks compare its
//    length, not the members' shapes) and nothing is copied back out.
//  * result (allgather, alltoall, reducescatter, and groups of mixed dtypes): the callback reads the
//    inputs in place; the output shapes are known only once the runtime is done, so it allocates each
//    output then (trainrun_output) and writes the result into it.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// (id, spec, in_place, number of buffers, data pointers, dtypes (TF enum), ranks, dims flattened)
typedef void (*SubmitFn)(int64_t, const char*, int, int, void**, int*, int*, const int64_t*);
std::atomic<SubmitFn> submit_fn{nullptr};

struct Entry {
  OpKernelContext* context;
  AsyncOpKernel::DoneCallback done;
  bool in_submit = true;   // the callback has not returned yet: completion waits for it
  bool completed = false;
  absl::Status status;
};

std::mutex entries_mu;
std::unordered_map<int64_t, Entry> entries;
std::atomic<int64_t> next_id{1};

constexpr int64_t kAlign = 64;  // bytes: every fused part starts aligned, as TensorFlow's allocator aligns

class TrainrunCollectiveOp : public AsyncOpKernel {
 public:
  explicit TrainrunCollectiveOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("spec", &spec_));
    OP_REQUIRES_OK(c, c->GetAttr("in_place", &in_place_));
  }

  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    SubmitFn submit = submit_fn.load();
    OP_REQUIRES_ASYNC(c, submit != nullptr,
                      absl::FailedPreconditionError("trainrun's runtime is not loaded in this process "
                                                    "(import trainrun.tensorflow or horovod.tensorflow)"),
                      done);
    std::vector<void*> ptrs;
    std::vector<int> dtypes, ranks;
    std::vector<int64_t> dims;
    if (in_place_) {
      OP_REQUIRES_OK_ASYNC(c, PrepareOutputs(c, &ptrs, &dtypes, &ranks, &dims), done);
    } else {
      for (int i = 0; i < c->num_inputs(); ++i) Describe(c->input(i), &ptrs, &dtypes, &ranks, &dims);
    }
    const int64_t id = next_id.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(entries_mu);
      Entry& e = entries[id];
      e.context = c;
      e.done = std::move(done);
    }
    submit(id, spec_.c_str(), in_place_ ? 1 : 0, static_cast<int>(ptrs.size()), ptrs.data(), dtypes.data(),
           ranks.data(), dims.data());
    DoneCallback finished;
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(entries_mu);
      auto it = entries.find(id);
      it->second.in_submit = false;
      if (!it->second.completed) return;  // trainrun_complete finishes it
      finished = std::move(it->second.done);
      status = it->second.status;
      entries.erase(it);
    }
    if (!status.ok()) c->SetStatus(status);
    finished();
  }

 private:
  static void Describe(const Tensor& t, std::vector<void*>* ptrs, std::vector<int>* dtypes, std::vector<int>* ranks,
                       std::vector<int64_t>* dims) {
    ptrs->push_back(const_cast<void*>(static_cast<const void*>(t.tensor_data().data())));
    dtypes->push_back(static_cast<int>(t.dtype()));
    ranks->push_back(t.dims());
    for (int d = 0; d < t.dims(); ++d) dims->push_back(t.dim_size(d));
  }

  // The outputs, each with its input's value, and the buffer(s) the runtime works in.
  absl::Status PrepareOutputs(OpKernelContext* c, std::vector<void*>* ptrs, std::vector<int>* dtypes,
                              std::vector<int>* ranks, std::vector<int64_t>* dims) {
    const int n = c->num_inputs();
    if (n == 1) {
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(c->forward_input_or_allocate_output({0}, 0, c->input(0).shape(), &out));
      const auto in = c->input(0).tensor_data();
      if (out->tensor_data().data() != in.data() && !in.empty()) {
        std::memcpy(const_cast<char*>(out->tensor_data().data()), in.data(), in.size());
      }
      Describe(*out, ptrs, dtypes, ranks, dims);  // with its shape: the ranks' shapes are compared
      return absl::OkStatus();
    }
    const auto dtype = c->input(0).dtype();
    const int64_t item = tensorflow::DataTypeSize(dtype);
    if (item == 0) return absl::InvalidArgumentError("TrainrunCollective: a dtype without a fixed size");
    const int64_t step = kAlign % item == 0 ? kAlign / item : 1;
    std::vector<int64_t> offsets(n);
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      if (c->input(i).dtype() != dtype) return absl::InvalidArgumentError("TrainrunCollective: mixed dtypes in place");
      offsets[i] = total;
      total += (c->input(i).NumElements() + step - 1) / step * step;
    }
    Tensor fused;
    TF_RETURN_IF_ERROR(c->allocate_temp(dtype, TensorShape({total}), &fused));
    char* base = const_cast<char*>(fused.tensor_data().data());
    for (int i = 0; i < n; ++i) {
      const auto in = c->input(i).tensor_data();
      if (!in.empty()) std::memcpy(base + offsets[i] * item, in.data(), in.size());
      Tensor out;
      if (!out.CopyFrom(fused.Slice(offsets[i], offsets[i] + c->input(i).NumElements()), c->input(i).shape())) {
        return absl::InternalError("TrainrunCollective: cannot view the fused buffer");
      }
      c->set_output(i, out);
    }
    ptrs->push_back(base);
    dtypes->push_back(static_cast<int>(dtype));
    ranks->push_back(1);
    dims->push_back(total);
    return absl::OkStatus();
  }

  std::string spec_;
  bool in_place_ = false;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void trainrun_set_submit(SubmitFn fn) { submit_fn.store(fn); }

// Output `index` of op `id` with the given shape, allocated now; its data pointer (null: the
// allocation failed, and the op's status says why).
__attribute__((visibility("default"))) void* trainrun_output(int64_t id, int index, int rank, const int64_t* dims) {
  OpKernelContext* c;
  {
    std::lock_guard<std::mutex> lock(entries_mu);
    auto it = entries.find(id);
    if (it == entries.end()) return nullptr;
    c = it->second.context;
  }
  TensorShape shape;
  for (int d = 0; d < rank; ++d) {
    if (!shape.AddDimWithStatus(dims[d]).ok()) return nullptr;
  }
  Tensor* out = nullptr;
  absl::Status st = c->allocate_output(index, shape, &out);
  if (!st.ok()) {
    c->SetStatus(st);
    return nullptr;
  }
  return const_cast<char*>(out->tensor_data().data());
}

// Op `id` is done: code 0, or TensorFlow's error code and a message.
__attribute__((visibility("default"))) void trainrun_complete(int64_t id, int code, const char* message) {
  AsyncOpKernel::DoneCallback done;
  OpKernelContext* c;
  absl::Status status = code == 0 ? absl::OkStatus()
                                  : absl::Status(static_cast<absl::StatusCode>(code), message ? message : "");
  {
    std::lock_guard<std::mutex> lock(entries_mu);
    auto it = entries.find(id);
    if (it == entries.end()) return;
    if (it->second.in_submit) {  // the kernel finishes it once the callback returned
      it->second.completed = true;
      it->second.status = status;
      return;
    }
    done = std::move(it->second.done);
    c = it->second.context;
    entries.erase(it);
  }
  if (!status.ok()) c->SetStatus(status);
  done();  // (without the lock: TensorFlow may run the next nodes from here)
}

}  // extern "C"

REGISTER_OP("TrainrunCollective")
    .Input("inputs: T")
    .Output("outputs: U")
    .Attr("T: list(type) >= 1")
    .Attr("U: list(type) >= 1")
    .Attr("spec: string")
    .Attr("in_place: bool")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      bool in_place = false;
      TF_RETURN_IF_ERROR(c->GetAttr("in_place", &in_place));
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(i, in_place && i < c->num_inputs() ? c->input(i) : c->UnknownShape());
      }
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TrainrunCollective").Device(tensorflow::DEVICE_CPU), TrainrunCollectiveOp);
