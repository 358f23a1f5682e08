#pragma once
// A model's configuration whatever its architecture (BertConfig, Gpt2Config, ...): the
// ModelSpec that parsed it knows the type, and `as<C>()` reads it back, naming both types
// when they differ. Immutable and cheap to copy (shared).
#include <memory>
#include <string>
#include <typeinfo>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/core/error.h"
#include "meshtrain/models/lora_options.h"

namespace mt::models {

class ModelConfig {
 public:
  ModelConfig() = default;
  template <class C>
  ModelConfig(C config)  // NOLINT: implicit, so a parse function can return its config type
      : value_(std::make_shared<const C>(std::move(config))),
        type_(&typeid(C)),
        lora_([](const void* v) -> const LoraOptions& { return static_cast<const C*>(v)->lora; }),
        with_lora_([](const void* v, const LoraOptions& lora) {
          C copy = *static_cast<const C*>(v);
          copy.lora = lora;
          return ModelConfig(std::move(copy));
        }),
        remat_([](const void* v) { return static_cast<const C*>(v)->remat; }),
        with_remat_([](const void* v, Remat remat) {
          C copy = *static_cast<const C*>(v);
          copy.remat = remat;
          return ModelConfig(std::move(copy));
        }) {}

  // The LoRA adapters the model's parameters carry (rank 0: none).
  const LoraOptions& lora() const {
    static const LoraOptions none;
    return value_ ? lora_(value_.get()) : none;
  }
  // A copy of this config whose model carries `lora` adapters.
  ModelConfig with_lora(const LoraOptions& lora) const {
    MT_CHECK(value_ != nullptr, "[model] with_lora on an empty config");
    return with_lora_(value_.get(), lora);
  }

  // What the training forward recomputes in backward (none unless --remat asks).
  Remat remat() const { return value_ ? remat_(value_.get()) : Remat::none; }
  ModelConfig with_remat(Remat remat) const {
    MT_CHECK(value_ != nullptr, "[model] with_remat on an empty config");
    return with_remat_(value_.get(), remat);
  }

  bool has_value() const { return value_ != nullptr; }
  template <class C>
  bool holds() const {
    return type_ && *type_ == typeid(C);
  }
  template <class C>
  const C& as() const {
    MT_CHECK(holds<C>(), "[model] the config is a ", type_ ? type_->name() : "(none)", ", not a ", typeid(C).name());
    return *static_cast<const C*>(value_.get());
  }

 private:
  std::shared_ptr<const void> value_;
  const std::type_info* type_ = nullptr;
  const LoraOptions& (*lora_)(const void*) = nullptr;
  ModelConfig (*with_lora_)(const void*, const LoraOptions&) = nullptr;
  Remat (*remat_)(const void*) = nullptr;
  ModelConfig (*with_remat_)(const void*, Remat) = nullptr;
};

}  // namespace mt::models
