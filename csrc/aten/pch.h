// Precompiled header of the aten/ and python/ layers: torch's headers are
// most of their compile time on a small machine.
#pragma once

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
