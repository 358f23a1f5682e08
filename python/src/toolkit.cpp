// The Redco layer from Python: Deployer, Trainer, Predictor and the optimizers over Python
// collate/loss/predict functions. The C++ Trainer runs with the GIL released; the loader
// thread's collate and the training thread's loss take it back for the Python call. Examples
// stay Python objects: the C++ side sees each as its index, and the collate wrapper hands the
// user's function the rows themselves.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "meshtrain/distributed/grad_reducer.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/train/stop_signal.h"
#include "python/src/bindings.h"
#include "python/src/conversions.h"

namespace py = pybind11;
using namespace mt;
using train::Batch;
using mt::python::dict_of;
using mt::python::held;
using mt::python::params_of;

namespace {

// A dataset of n Python examples, each seen by the C++ side as {"__index__": i}.
class IndexDataset final : public data::Dataset {
 public:
  explicit IndexDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t index) const override {
    MT_CHECK(index >= 0 && index < n_, "[dataset] index ", index, " outside [0, ", n_, ")");
    return data::Example{{"__index__", index}};
  }

 private:
  int64_t n_;
};

// The examples a collate wrapper reads (held with the GIL: copies and releases happen under
// it), and the first Python exception a user's function raised during a fit, which fit raises
// again as itself (with its traceback) once the engine has unwound.
struct Rows {
  py::list examples;
  std::shared_ptr<py::error_already_set> error;
  ~Rows() {
    // The list and the error are released here, under the GIL, whatever thread ends them.
    py::gil_scoped_acquire gil;
    py::object released = std::move(examples);
    error.reset();
  }
  // Calls fn under the GIL, keeping a Python exception it raises. A first Ctrl-C during a fit
  // (KeyboardInterrupt, raised in whatever Python code the main thread runs: the loss) asks
  // the Trainer to stop after this step and write its checkpoint, and fn runs again (the
  // functions are pure: the interrupted call's partial graph is dropped); a second stops now.
  template <class F>
  auto call(F&& fn) {
    try {
      return fn();
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) && train::stop_armed() && !train::stop_requested()) {
        train::request_stop();
        return call(std::forward<F>(fn));
      }
      if (!error) error = std::make_shared<py::error_already_set>(e);
      throw;
    }
  }
};

// Runs the engine (f) with the GIL released; when it fails because a user's function raised,
// raises that Python exception itself instead of the engine's report of it.
template <class F>
auto run_released(Rows& rows, F&& f) {
  rows.error.reset();
  try {
    py::gil_scoped_release release;
    return f();
  } catch (py::error_already_set&) {
    throw;  // a Python error that reached here itself
  } catch (const train::Interrupted& e) {
    // Stopped on Ctrl-C after writing its checkpoint: KeyboardInterrupt, saying where.
    std::string what = e.what();
    const size_t at = what.rfind("--resume");
    if (at != std::string::npos) what.replace(at, 8, "fit(..., resume=True)");
    PyErr_SetString(PyExc_KeyboardInterrupt, what.c_str());
    throw py::error_already_set();
  } catch (...) {
    if (rows.error) {
      auto e = std::move(rows.error);
      throw *e;
    }
    throw;
  }
}

Batch batch_of(const py::handle& out, const char* what) {
  if (!py::isinstance<py::dict>(out))
    throw Error(detail::concat("[", what, "] must return a dict of arrays, got ", std::string(py::str(out.get_type()))));
  py::module_ mt_py = py::module_::import("meshtrain");
  Batch b;
  for (auto [k, v] : out.cast<py::dict>()) b.set(k.cast<std::string>(), mt_py.attr("array")(v).cast<Array>());
  return b;
}

train::CollateFn collate_of(const py::function& fn, const std::shared_ptr<Rows>& rows) {
  auto f = held(fn);
  return [f, rows](const std::vector<data::Example>& examples) {
    // Python builds the batch on the host, and it goes to the device once the GIL is released:
    // a loader thread holding the GIL must neither wait for a capture the training thread is
    // recording (whose Python loss or pred_fn needs the GIL: a deadlock) nor put GPU work of
    // its own (a dtype cast) on the stream, where a capture starting meanwhile would record it.
    const Device device = current_device();
    Batch host;
    {
      py::gil_scoped_acquire gil;
      const DeviceScope on_host(Device::cpu());
      host = rows->call([&] {
        py::list batch;
        for (const data::Example& e : examples) batch.append(rows->examples[size_t(e.as_int("__index__"))]);
        return batch_of((*f)(batch), "collate_fn");
      });
    }
    Batch placed;
    for (const auto& [key, array] : host) placed.set(key, array.to(device));  // to() keeps a host array on the CPU
    return placed;
  };
}

// The Python loss: (flat params dict, batch dict, key (seed, stream, step), training) -> scalar
// Array or (scalar, aux).
train::LossFn loss_of(const py::function& fn, const std::shared_ptr<Rows>& rows) {
  auto f = held(fn);
  return [f, rows](const Params& p, const Batch& b, const RngKey& key, bool training) -> Array {
    py::gil_scoped_acquire gil;
    return rows->call([&] {
      // (seed, stream, step): the step still folded in last, as the C++ loss's key does.
      py::object r = (*f)(dict_of(p), dict_of(b), python::key_tuple(key), training);
      if (py::isinstance<py::tuple>(r) && py::len(r) == 2) r = r.cast<py::tuple>()[0];
      if (!py::isinstance<Array>(r))
        throw Error("[loss_fn] must return a meshtrain array (a scalar), or (scalar, aux)");
      return r.cast<Array>();
    });
  };
}

optim::Schedule schedule_of(const py::object& lr) {
  if (py::isinstance<py::float_>(lr) || py::isinstance<py::int_>(lr)) return optim::constant_schedule(lr.cast<double>());
  return lr.cast<optim::Schedule>();
}

// Roles from Python: a model's (Model.param_roles()) or a dict {path: (kind, in_dim, out_dim)}
// with kind one of ParamKind's names ("attention_qkv", "mlp_in", ...); paths without a role
// are "other" (replicated, or split over data under FSDP).
models::ParamRoles roles_of(const py::object& roles) {
  if (roles.is_none()) return {};
  if (py::isinstance<PyParamRoles>(roles)) return roles.cast<const PyParamRoles&>().roles;
  models::ParamRoles out;
  for (auto [k, v] : roles.cast<py::dict>()) {
    auto t = v.cast<py::tuple>();
    const std::string kind = t[0].cast<std::string>();
    models::ParamRole r;
    bool found = false;
    for (int i = 0; i <= int(models::ParamKind::other); ++i)
      if (kind == models::param_kind_name(models::ParamKind(i))) r.kind = models::ParamKind(i), found = true;
    MT_CHECK(found, "[sharding_rules] unknown parameter kind '", kind, "' for ", k.cast<std::string>());
    r.in_dim = py::len(t) > 1 ? t[1].cast<int>() : -1;
    r.out_dim = py::len(t) > 2 ? t[2].cast<int>() : -1;
    out[k.cast<std::string>()] = r;
  }
  return out;
}

// The precision policy a Python Trainer or Predictor runs under (mt::PrecisionPolicy, as the
// CLI's --precision) and f16's loss scale ("dynamic" or a number, as --loss-scale).
PrecisionPolicy policy_of(const std::string& precision) { return precision_policy_from_name(precision, "precision"); }
optim::LossScaleOptions loss_scale_of(const PrecisionPolicy& policy, const py::object& scale, int64_t window) {
  optim::LossScaleOptions o;
  const bool given = !(py::isinstance<py::str>(scale) && scale.cast<std::string>() == "dynamic");
  MT_CHECK(policy.loss_scaling || (!given && window == o.growth_interval), "[Trainer] loss_scale applies to precision='f16' (bf16 "
           "has f32's range and needs none); this trainer's precision is '", policy.name, "'");
  if (given) {
    // A number of any kind (NumPy's too), but not a bool: loss_scale=True would be a scale of 1.
    PyObject* as_float = py::isinstance<py::bool_>(scale) || py::isinstance<py::str>(scale)
                             ? nullptr
                             : PyNumber_Float(scale.ptr());
    if (!as_float) PyErr_Clear();
    MT_CHECK(as_float != nullptr, "[Trainer] loss_scale must be 'dynamic' or a number, got ",
             std::string(py::repr(scale)));
    o.dynamic = false;
    o.init_scale = py::reinterpret_steal<py::float_>(as_float).cast<double>();
  }
  o.growth_interval = window;
  optim::validate(o, "Trainer loss_scale");
  return o;
}

class PyTrainer {
 public:
  PyTrainer(train::Deployer& deployer, const py::function& collate, const py::function& loss,
            const std::map<std::string, Array>& params, optim::Transform optimizer,
            std::optional<train::ShardingPlan> plan, const std::string& precision, const py::object& loss_scale,
            int64_t loss_scale_window)
      : rows_(std::make_shared<Rows>()),
        policy_(policy_of(precision)),
        loss_scale_(loss_scale_of(policy_, loss_scale, loss_scale_window)) {
    Params p = params_of(params);
    trainer_ = std::make_unique<train::Trainer>(deployer, collate_of(collate, rows_), loss_of(loss, rows_), std::move(p),
                                                std::move(optimizer), std::move(plan));
  }
  py::dict fit(const py::list& examples, int64_t per_device_batch_size, int64_t epochs, int64_t max_steps,
               const py::object& eval_examples, int64_t eval_every, int64_t save_every, bool resume, bool shuffle,
               int grad_accum_steps, bool progress) {
    rows_->examples = examples;
    train::FitOptions o;
    o.per_device_batch_size = per_device_batch_size, o.epochs = epochs, o.max_steps = max_steps;
    o.eval_every = eval_every, o.save_every = save_every, o.resume = resume, o.shuffle = shuffle;
    o.grad_accum_steps = grad_accum_steps, o.progress = progress;
    o.loss_scale = loss_scale_;
    std::shared_ptr<const data::Dataset> train = std::make_shared<IndexDataset>(int64_t(py::len(examples)));
    if (!eval_examples.is_none()) {
      // Eval rows follow the training rows in the one list the collate wrapper reads.
      const int64_t n = int64_t(py::len(examples));
      py::list both;
      for (auto e : examples) both.append(e);
      for (auto e : eval_examples.cast<py::list>()) both.append(e);
      rows_->examples = both;
      o.eval_data = std::make_shared<OffsetDataset>(n, int64_t(py::len(eval_examples)));
    }
    // Ctrl-C stops after the step in flight, with a checkpoint (Rows::call); only during fit.
    train::arm_stop_request("stopping after this step (a checkpoint follows)");
    train::clear_stop_request();
    struct Disarm {
      ~Disarm() { train::disarm_stop_request(); }
    } disarm;
    train::FitResult r = run_released(*rows_, [&] {
      PrecisionScope scope(policy_);
      return trainer_->fit(train, o);
    });
    py::dict out;
    out["losses"] = r.losses;
    out["evals"] = r.evals;
    out["steps"] = r.steps;
    return out;
  }
  py::dict params() const { return dict_of(trainer_->params()); }
  double eval_loss(const py::list& examples, int64_t per_device_batch_size) {
    rows_->examples = examples;
    auto data = std::make_shared<IndexDataset>(int64_t(py::len(examples)));
    return run_released(*rows_, [&] {
      PrecisionScope scope(policy_);
      return trainer_->eval_loss(data, per_device_batch_size);
    });
  }
  int64_t step() const { return trainer_->step(); }
  train::Trainer& trainer() { return *trainer_; }
  std::map<std::string, double> last_step_metrics() const { return trainer_->last_step_metrics(); }

 private:
  // Rows [offset, offset + n) of the examples list.
  class OffsetDataset final : public data::Dataset {
   public:
    OffsetDataset(int64_t offset, int64_t n) : offset_(offset), n_(n) {}
    int64_t size() const override { return n_; }
    data::Example get(int64_t index) const override {
      MT_CHECK(index >= 0 && index < n_, "[dataset] index ", index, " outside [0, ", n_, ")");
      return data::Example{{"__index__", offset_ + index}};
    }

   private:
    int64_t offset_, n_;
  };
  std::shared_ptr<Rows> rows_;
  PrecisionPolicy policy_;
  optim::LossScaleOptions loss_scale_;
  std::unique_ptr<train::Trainer> trainer_;
};

// Predictor over Python functions: pred_fn(flat params dict, batch dict) -> dict of arrays,
// output_fn(dict of NumPy arrays) -> one output per example. Outputs stay Python objects in a
// list owned here; the C++ Predictor sees their positions.
class PyPredictor {
 public:
  PyPredictor(train::Deployer& deployer, const py::function& collate, const py::function& pred,
              const py::function& output, const std::string& precision)
      : deployer_(deployer), rows_(std::make_shared<Rows>()), collate_(held(collate)), pred_(held(pred)),
        output_(held(output)), policy_(policy_of(precision)) {}

  py::list predict(const py::list& examples, const std::map<std::string, Array>& params,
                   int64_t per_device_batch_size) {
    rows_->examples = examples;
    auto results = std::make_shared<py::list>();
    auto rows = rows_;
    auto pred = pred_;
    auto output = output_;
    train::PredFn pred_fn = [pred, rows](const Params& p, const Batch& b) {
      py::gil_scoped_acquire gil;
      return rows->call([&] { return batch_of((*pred)(dict_of(p), dict_of(b)), "pred_fn"); });
    };
    auto output_fn = [output, rows, results](const Batch& host) {
      py::gil_scoped_acquire gil;
      return rows->call([&] {
        py::dict arrays;
        for (const auto& [k, v] : host) arrays[py::str(k)] = py::module_::import("numpy").attr("asarray")(v);
        py::object outs = (*output)(arrays);
        std::vector<int64_t> at;
        for (auto o : outs) {
          at.push_back(int64_t(py::len(*results)));
          results->append(o);
        }
        return at;
      });
    };
    train::Predictor<int64_t> predictor(deployer_, collate_of(*collate_, rows_), pred_fn, output_fn);
    predictor.set_padded_fields(padded_fields_);
    const Params p = params_of(params);
    auto data = std::make_shared<IndexDataset>(int64_t(py::len(examples)));
    std::vector<int64_t> at = run_released(*rows_, [&] {
      PrecisionScope scope(policy_);
      return predictor.predict(p, data, per_device_batch_size);
    });
    py::list out;
    for (int64_t i : at) out.append((*results)[size_t(i)]);
    return out;
  }

 private:
  train::Deployer& deployer_;
  std::shared_ptr<Rows> rows_;
  std::shared_ptr<py::function> collate_, pred_, output_;
  PrecisionPolicy policy_;

 public:
  std::vector<train::PaddedFields> padded_fields_;
};

}  // namespace

void bind_toolkit(py::module_& m) {
  // optax's shape: state = opt.init(params); updates, state = opt.update(grads, state, params);
  // params = optim.apply_updates(params, updates), over flat {path: Array} dicts (the package
  // wraps them for pytrees).
  py::class_<optim::Transform>(m, "Transform")
      .def("_init", [](const optim::Transform& t, const std::map<std::string, Array>& params) {
        return dict_of(t.init(params_of(params)));
      })
      .def("_update", [](const optim::Transform& t, const std::map<std::string, Array>& grads,
                         const std::map<std::string, Array>& state, const std::map<std::string, Array>& params) {
        Params s = params_of(state);
        Params u = t.update(params_of(grads), s, params_of(params));
        return py::make_tuple(dict_of(u), dict_of(s));
      });
  py::module_ optim_m = m.def_submodule("optim", "optax-like gradient transforms and schedules");
  optim_m.def("constant_schedule", &optim::constant_schedule);
  optim_m.def("linear_schedule", &optim::linear_schedule, py::arg("init"), py::arg("end"), py::arg("steps"));
  optim_m.def("cosine_decay_schedule", &optim::cosine_decay_schedule, py::arg("init"), py::arg("steps"),
              py::arg("alpha") = 0.0);
  optim_m.def("warmup_cosine_decay_schedule", &optim::warmup_cosine_decay_schedule, py::arg("init"), py::arg("peak"),
              py::arg("warmup"), py::arg("decay_steps"), py::arg("end") = 0.0);
  optim_m.def("warmup_linear_decay_schedule", &optim::warmup_linear_decay_schedule, py::arg("peak"),
              py::arg("warmup"), py::arg("total_steps"), py::arg("end") = 0.0);
  optim_m.def("sgd",
              [](const py::object& lr, double momentum, bool nesterov, double wd) {
                return optim::sgd(schedule_of(lr), momentum, nesterov, wd);
              },
              py::arg("learning_rate"), py::arg("momentum") = 0.0, py::arg("nesterov") = false,
              py::arg("weight_decay") = 0.0);
  optim_m.def("adam",
              [](const py::object& lr, double b1, double b2, double eps) { return optim::adam(schedule_of(lr), b1, b2, eps); },
              py::arg("learning_rate"), py::arg("b1") = 0.9, py::arg("b2") = 0.999, py::arg("eps") = 1e-8);
  optim_m.def("adamw",
              [](const py::object& lr, double b1, double b2, double eps, double wd) {
                return optim::adamw(schedule_of(lr), b1, b2, eps, wd);
              },
              py::arg("learning_rate"), py::arg("b1") = 0.9, py::arg("b2") = 0.999, py::arg("eps") = 1e-8,
              py::arg("weight_decay") = 0.01);
  optim_m.def("clip_by_global_norm", &optim::clip_by_global_norm, py::arg("max_norm"));
  optim_m.def("identity", &optim::identity);
  optim_m.def("freeze", &optim::freeze);
  optim_m.def("partition",
              [](const std::vector<std::pair<std::string, optim::Transform>>& rules) {
                std::vector<optim::PartitionRule> r;
                for (const auto& [pattern, t] : rules) r.push_back({pattern, t});
                return optim::partition(r);
              },
              py::arg("rules"));
  optim_m.def("_apply_updates", [](const std::map<std::string, Array>& params, const std::map<std::string, Array>& u) {
    return dict_of(optim::apply_updates(params_of(params), params_of(u)));
  });
  optim_m.def("chain", [](const std::vector<optim::Transform>& ts) { return optim::chain(ts); });

  py::class_<train::Deployer>(m, "Deployer")
      .def(py::init([](const std::string& mesh, int n_model_shards, const std::string& workdir, uint64_t seed,
                       const std::string& device, bool verbose, const py::object& grad_reduce_dtype) {
             train::DeployerOptions o;
             o.mesh = mesh, o.n_model_shards = n_model_shards, o.workdir = workdir, o.seed = seed, o.device = device;
             o.verbose = verbose;
             // As --grad-reduce-dtype, process-wide: the dtype data-parallel gradient all-reduces
             // travel in. Set once the Deployer exists, and only when given (a later Deployer
             // without it keeps the choice).
             std::string wire;
             if (!grad_reduce_dtype.is_none()) {
               wire = py::cast<std::string>(grad_reduce_dtype);
               MT_CHECK(wire == "f32" || wire == "bf16", "[Deployer] grad_reduce_dtype='", wire,
                        "': expected 'f32' or 'bf16'");
             }
             auto deployer = std::make_unique<train::Deployer>(o);
             if (!wire.empty()) dist::set_grad_reduce_dtype(wire == "bf16" ? DType::bf16 : DType::f32);
             return deployer;
           }),
           py::arg("mesh") = "", py::arg("n_model_shards") = 1, py::arg("workdir") = "runs/default",
           py::arg("seed") = 0, py::arg("device") = "auto", py::arg("verbose") = true,
           py::arg("grad_reduce_dtype") = py::none())
      .def_property_readonly("workdir", [](const train::Deployer& d) { return d.options().workdir; })
      .def("_sharding_rules",
           [](const train::Deployer& d, const std::map<std::string, Array>& params, const py::object& roles, bool fsdp,
              int64_t fsdp_min_elements) {
             const Params p = params_of(params);
             train::ShardingOptions o;
             o.fsdp = fsdp;
             o.fsdp_min_elements = fsdp_min_elements;
             return d.sharding_rules(p, roles_of(roles), o);
           },
           py::arg("params"), py::arg("roles") = py::none(), py::arg("fsdp") = false,
           py::arg("fsdp_min_elements") = int64_t(1) << 14)
      .def("log", &train::Deployer::log)
      .def_property_readonly("init_key",
                             [](const train::Deployer& d) {
                               const RngKey k = d.init_key();
                               return py::make_tuple(k.seed, k.stream);
                             })
      .def_property_readonly("is_main", &train::Deployer::is_main)
      .def_property_readonly("data_size", &train::Deployer::data_size)
      .def_property_readonly("data_index", &train::Deployer::data_index);

  py::class_<PyParamRoles>(m, "ParamRoles");
  py::class_<train::ShardingPlan>(m, "ShardingPlan")
      .def("table", &train::ShardingPlan::table)
      .def("__repr__", &train::ShardingPlan::table);

  py::class_<PyTrainer>(m, "_Trainer")
      .def(py::init<train::Deployer&, const py::function&, const py::function&, const std::map<std::string, Array>&,
                    optim::Transform, std::optional<train::ShardingPlan>, const std::string&, const py::object&,
                    int64_t>(),
           py::keep_alive<1, 2>())
      .def("fit", &PyTrainer::fit, py::arg("examples"), py::arg("per_device_batch_size"), py::arg("epochs"),
           py::arg("max_steps"), py::arg("eval_examples"), py::arg("eval_every"), py::arg("save_every"),
           py::arg("resume"), py::arg("shuffle"), py::arg("grad_accum_steps"), py::arg("progress"))
      .def("params", &PyTrainer::params)
      .def("_set_padded_fields",
           [](PyTrainer& t, std::vector<train::PaddedFields> groups) { t.trainer().set_padded_fields(std::move(groups)); })
      .def("eval_loss",
           [](PyTrainer& t, const py::list& examples, int64_t per_device_batch_size) {
             return t.eval_loss(examples, per_device_batch_size);
           })
      .def_property_readonly("step", &PyTrainer::step)
      .def_property_readonly("last_step_metrics", &PyTrainer::last_step_metrics);

  py::class_<PyPredictor>(m, "_Predictor")
      .def(py::init<train::Deployer&, const py::function&, const py::function&, const py::function&,
                    const std::string&>(),
           py::keep_alive<1, 2>())
      .def("predict", &PyPredictor::predict, py::arg("examples"), py::arg("params"),
           py::arg("per_device_batch_size"))
      .def("_set_padded_fields",
           [](PyPredictor& p, std::vector<train::PaddedFields> groups) { p.padded_fields_ = std::move(groups); });
}
