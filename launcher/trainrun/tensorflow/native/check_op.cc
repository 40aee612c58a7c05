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
