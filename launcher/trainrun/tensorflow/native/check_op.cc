// TrainrunCheck: fail the running step with a given TensorFlow error code and message, or do nothing.
//
// A collective in a graph runs inside a tf.numpy_function node, and TensorFlow turns every Python
// exception raised there into UnknownError (ValueError into InvalidArgumentError). Horovod's programs
// catch tf.errors.FailedPreconditionError for a mismatch between ranks, so the node returns the error's
// code and message instead of raising, and this kernel raises them with that code.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

class TrainrunCheckOp : public OpKernel {
 public:
  explicit TrainrunCheckOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* c) override {
    const int code = c->input(0).scalar<tensorflow::int32>()();
    if (code == 0) return;
    c->SetStatus(absl::Status(static_cast<absl::StatusCode>(code),
                              std::string(c->input(1).scalar<tensorflow::tstring>()())));
  }
};

}  // namespace

REGISTER_OP("TrainrunCheck")
    .Input("code: int32")
    .Input("message: string")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext*) { return absl::OkStatus(); });

REGISTER_KERNEL_BUILDER(Name("TrainrunCheck").Device(tensorflow::DEVICE_CPU), TrainrunCheckOp);

// TrainrunWait: pass a collective's id through once the collective is done, holding no thread meanwhile.
//
// A graph collective is a submit node (numpy_function: hands the op to trainrun's engine, returns an
// id at once), this node, and a finish node (numpy_function: takes the result, which is ready). This
// kernel is asynchronous: while the collective is in flight it occupies none of TensorFlow's inter-op
// threads, so any number of collectives can be in flight in one step, started in any order. Python's
// waiter thread (graph_ops.py) calls trainrun_release(id) when the op completes (or failed); a release
// that comes before the node runs is remembered and the node then finishes at once.
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace {

std::mutex released_mu;
std::unordered_map<int64_t, std::function<void()>> waiting;  // id -> the node's done callback
std::unordered_set<int64_t> released;                         // released before their node ran

class TrainrunWaitOp : public tensorflow::AsyncOpKernel {
 public:
  explicit TrainrunWaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    const int64_t id = c->input(0).scalar<int64_t>()();
    c->set_output(0, c->input(0));
    std::unique_lock<std::mutex> lock(released_mu);
    if (released.erase(id)) {
      lock.unlock();
      done();
      return;
    }
    waiting.emplace(id, std::move(done));
  }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void trainrun_release(int64_t id) {
  std::function<void()> done;
  {
    std::lock_guard<std::mutex> lock(released_mu);
    auto it = waiting.find(id);
    if (it == waiting.end()) {
      released.insert(id);
      return;
    }
    done = std::move(it->second);
    waiting.erase(it);
  }
  done();  // (without the lock: TensorFlow may schedule the next nodes from here)
}

REGISTER_OP("TrainrunWait")
    .Input("id: int64")
    .Output("same_id: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TrainrunWait").Device(tensorflow::DEVICE_CPU), TrainrunWaitOp);
