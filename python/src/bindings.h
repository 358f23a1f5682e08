#pragma once
// The parts of the _meshtrain extension, each registering its names on the module.
#include <pybind11/pybind11.h>

// Deployer, Trainer and the optimizers (toolkit.cpp).
void bind_toolkit(pybind11::module_& m);
// Models (from_pretrained, apply, loss, generate, save_pretrained) and tokenizers (models.cpp).
void bind_models(pybind11::module_& m);
// DLPack export and import (dlpack.cpp).
void bind_dlpack(pybind11::module_& m);
