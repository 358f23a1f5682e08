#pragma once
// The parts of the _meshtrain extension, each registering its names on the module.
#include <pybind11/pybind11.h>

#include "meshtrain/models/param_roles.h"

// A model's parameter roles as one Python object (a std::map would convert to a dict).
struct PyParamRoles {
  mt::models::ParamRoles roles;
};

// Deployer, Trainer and the optimizers (toolkit.cpp).
void bind_toolkit(pybind11::module_& m);
// Models (from_pretrained, apply, loss, generate, save_pretrained) and tokenizers (models.cpp).
void bind_models(pybind11::module_& m);
// DLPack export and import (dlpack.cpp).
void bind_dlpack(pybind11::module_& m);
// Post-training losses and metrics: DPO, GRPO, distillation, record_metric (posttrain.cpp).
void bind_posttrain(pybind11::module_& m);
// Image decoding and ViTImageProcessor's preprocessing, mt.data (images.cpp).
void bind_images(pybind11::module_& m);
