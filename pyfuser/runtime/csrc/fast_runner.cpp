// pyfuser's native cached-call runner: a replay of recorded fusion programs with no Python frame.
//
// A `Runner` belongs to one Fusion (runtime/dispatch.py's _Programs). `runner.add(inputs, steps,
// results, effects, device)` records one program under the key of `inputs`; `runner.run(inputs)`
// computes the key of its argument, and on a hit replays the program:
//   slots = the input tensors; then per step
//     ("alloc", sizes, strides, like)   slots += at::empty_strided(sizes, strides, like.options())
//     ("view", base, sizes, strides)    slots += slots[base].as_strided(sizes, strides)
//     ("const", tensor, stream)         slots += tensor (a grid reduction's semaphores: a zeroed
//                                       buffer every launch leaves zero, valid on that stream only:
//                                       a replay on another stream is a miss)
//     ("launch", fn, ctx, buffer, param_offsets, writes, fail[, draw, rng_writes])
//         buffer = a CUlaunchConfig (stream at byte 32) then the packed kernel parameters;
//         writes = [(byte offset, slot)]: that slot's data_ptr is written there each call;
//         draw() -> (seed, offset, state): a random-number kernel's generator state for this
//         launch and the address of its device words (runtime/rng.py's drawer), written as
//         int64 at rng_writes = [(byte offset, 0 seed / 1 offset / 2 state)]; every draw of a
//         replay is made before any buffer is written;
//         cuLaunchKernelEx(buffer, fn, &param pointers, NULL)
//   then the `effects` (("setattr", obj, name, value), ("setitem", mapping, key, value),
//   ("incr", obj, name)) keep the executors' counters and run reports as the Python path does,
//   and the result is [slots[r] for r in results].
// A miss (another key, an input that is not a strided tensor, a wrong count, or PYFUSER_DUMP /
// PYFUSER_POISON_OUTPUTS in the environment dict) calls `slow(inputs)` and returns its result.
// Two options of the Runner: `grad_check` (grad mode on is a miss: the TorchScript call plans
// run groups under autograd eagerly) and `unpack` (0: the results as a list; 1: the only
// result itself; 2: a tuple), so a runner can stand for a whole function.
//
// The key is what executor.key_function's key fixes, per input: dtype, rank, sizes, strides,
// data_ptr % 16, device type and index. Every kernel parameter other than the tensor pointers is
// fixed by it, so a hit needs nothing but the pointers and the current stream.
//
// The driver entry points (cuLaunchKernelEx and the context calls) come as addresses through
// `configure(...)`, with a Python callable for the current raw stream; this module links no CUDA
// library. A refused launch is retried once with the program's context pushed when another (or
// none) is current, as launch.py's prepared launches do; a failure then calls `fail(code, call)`,
// which raises (CudaDriverError naming the launch).
//
// Invariants: the GIL is held throughout, and no Python code runs between the first buffer
// write and the last launch of a replay (the stream and the draws come first), so no buffer is
// shared between threads mid-write; every
// Python reference a program holds is visited by the garbage collector (a Runner is part of its
// Fusion's reference cycle).

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/TensorOptions.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Storage.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using LaunchEx = int (*)(const void* config, void* fn, void** params, void** extra);
using CtxGet = int (*)(void** ctx);
using CtxPush = int (*)(void* ctx);
using CtxPop = int (*)(void** ctx);

struct Driver {
  LaunchEx launch = nullptr;
  CtxGet get_current = nullptr;
  CtxPush push = nullptr;
  CtxPop pop = nullptr;
  PyObject* stream_fn = nullptr;  // callable(device index) -> raw stream as int
};
Driver g_driver;

constexpr size_t kStreamOffset = 32;  // CUlaunchConfig.hStream

// An owned Python reference.
struct Ref {
  PyObject* p = nullptr;
  Ref() = default;
  static Ref borrow(PyObject* o) { Py_XINCREF(o); Ref r; r.p = o; return r; }
  static Ref steal(PyObject* o) { Ref r; r.p = o; return r; }
  Ref(const Ref& o) : p(o.p) { Py_XINCREF(p); }
  Ref(Ref&& o) noexcept : p(o.p) { o.p = nullptr; }
  Ref& operator=(Ref o) noexcept { std::swap(p, o.p); return *this; }
  ~Ref() { Py_XDECREF(p); }
  PyObject* release() { PyObject* r = p; p = nullptr; return r; }  // the reference, to return
};

struct Alloc {
  std::vector<int64_t> sizes, strides;
  at::TensorOptions options;
};

struct View {
  uint32_t base;
  std::vector<int64_t> sizes, strides;
};

constexpr Py_ssize_t kDrawn = 3;             // values a draw() returns

struct Launch {
  std::vector<uint64_t> buffer;              // 8-byte aligned: config, then parameters
  std::vector<uint32_t> param_offsets;       // byte offsets of the parameters in `buffer`
  std::vector<void*> params;                 // &buffer[offset], set once the program is placed
  std::vector<std::pair<uint32_t, uint32_t>> writes;  // (byte offset, slot)
  void* fn = nullptr;
  void* ctx = nullptr;
  Ref fail;                                  // callable(code, call) -> raises
  Ref draw;                                  // callable() -> (seed, offset, state), or null
  std::vector<std::pair<uint32_t, uint8_t>> rng_writes;  // (byte offset, kDrawn index)
};

enum class StepKind : uint8_t { kAlloc, kView, kConst, kLaunch };
struct Step {
  StepKind kind;
  uint32_t index;
};

enum class EffectKind : uint8_t { kSetAttr, kSetItem, kIncr };
struct Effect {
  EffectKind kind;
  Ref obj, name, value;
};

struct Program {
  std::vector<Step> steps;
  std::vector<Alloc> allocs;
  std::vector<View> views;
  std::vector<Launch> launches;
  std::vector<at::Tensor> consts;
  bool pinned = false;       // a const step holds a buffer valid on one stream only
  void* pinned_stream = nullptr;
  std::vector<uint32_t> results;
  std::vector<Effect> effects;
  Ref device;  // device index (int) for the stream callable
  size_t slots = 0;

  void place() {
    for (auto& l : launches) {
      l.params.clear();
      char* base = reinterpret_cast<char*>(l.buffer.data());
      for (uint32_t off : l.param_offsets) l.params.push_back(base + off);
    }
  }
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};
// Programs are shared: a replay holds its own reference, so a program dropped (clear, add) by
// Python code that runs during the replay stays alive until the replay ends.
using ProgramMap = std::unordered_map<std::vector<int64_t>, std::shared_ptr<Program>, KeyHash>;

struct Runner {
  PyObject_HEAD
  Py_ssize_t n_inputs;
  PyObject* slow;       // callable(inputs)
  PyObject* env;        // dict of the raw environment (bytes -> bytes), or NULL
  PyObject* env_keys;   // tuple of bytes: any present means "take the slow path"
  ProgramMap* programs;
  std::vector<int64_t>* scratch;
  int grad_check;       // grad mode on: call slow
  int unpack;           // 0 list, 1 the only result, 2 tuple
};

// ---- keys -----------------------------------------------------------------------------------
bool items_of(PyObject* seq, PyObject*** items, Py_ssize_t* n) {
  if (PyList_CheckExact(seq)) {
    *items = reinterpret_cast<PyListObject*>(seq)->ob_item;
    *n = PyList_GET_SIZE(seq);
    return true;
  }
  if (PyTuple_CheckExact(seq)) {
    *items = reinterpret_cast<PyTupleObject*>(seq)->ob_item;
    *n = PyTuple_GET_SIZE(seq);
    return true;
  }
  return false;
}

// False when `inputs` is not n strided tensors (the slow path then decides what it is).
bool make_key(Py_ssize_t n_inputs, PyObject* inputs, std::vector<int64_t>& key) {
  PyObject** items;
  Py_ssize_t n;
  if (!items_of(inputs, &items, &n) || n != n_inputs) return false;
  key.clear();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = items[i];
    if (!THPVariable_Check(o)) return false;
    const at::Tensor& t = THPVariable_Unpack(o);
    if (!t.defined() || t.layout() != at::kStrided || t.is_conj() || t.is_neg()) return false;
    auto sizes = t.sizes();
    auto strides = t.strides();
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(static_cast<int64_t>(sizes.size()));
    key.insert(key.end(), sizes.begin(), sizes.end());
    key.insert(key.end(), strides.begin(), strides.end());
    key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15));
    key.push_back(static_cast<int64_t>(t.device().type()));
    key.push_back(static_cast<int64_t>(t.device().index()));
  }
  return true;
}

bool env_says_slow(Runner* self) {
  if (self->env == nullptr) return false;
  Py_ssize_t n = PyTuple_GET_SIZE(self->env_keys);
  for (Py_ssize_t i = 0; i < n; ++i) {
    int has = PyDict_Contains(self->env, PyTuple_GET_ITEM(self->env_keys, i));
    if (has != 0) return true;  // present, or an error: the slow path reads os.environ itself
  }
  return false;
}

PyObject* call_slow(Runner* self, PyObject* inputs) {
  if (PyErr_Occurred()) PyErr_Clear();
  return PyObject_CallOneArg(self->slow, inputs);
}

// ---- replay ---------------------------------------------------------------------------------
// cuLaunchKernelEx; if refused while another (or no) context is current, once more with the
// program's context pushed. Returns 0, or raises through `fail` and returns -1.
int launch(Launch& l) {
  char* buf = reinterpret_cast<char*>(l.buffer.data());
  int code = g_driver.launch(buf, l.fn, l.params.data(), nullptr);
  if (code == 0) return 0;
  const char* call = "launch";
  void* current = nullptr;
  if (g_driver.get_current(&current) == 0 && current != l.ctx) {
    int pushed = g_driver.push(l.ctx);
    if (pushed != 0) {
      code = pushed;
      call = "cuCtxPushCurrent";
    } else {
      code = g_driver.launch(buf, l.fn, l.params.data(), nullptr);
      void* popped = nullptr;
      int pop = g_driver.pop(&popped);
      if (code == 0 && pop != 0) {
        code = pop;
        call = "cuCtxPopCurrent";
      }
    }
  }
  if (code == 0) return 0;
  PyObject* r = PyObject_CallFunction(l.fail.p, "is", code, call);
  if (r != nullptr) {  // `fail` must raise; if it did not, say so
    Py_DECREF(r);
    PyErr_Format(PyExc_RuntimeError, "pyfuser native runner: launch failed with CUresult %d", code);
  }
  return -1;
}

bool apply_effects(Program& p) {
  for (auto& e : p.effects) {
    int rc = 0;
    if (e.kind == EffectKind::kSetAttr) {
      rc = PyObject_SetAttr(e.obj.p, e.name.p, e.value.p);
    } else if (e.kind == EffectKind::kSetItem) {
      rc = PyObject_SetItem(e.obj.p, e.name.p, e.value.p);
    } else {
      Ref v = Ref::steal(PyObject_GetAttr(e.obj.p, e.name.p));
      if (v.p == nullptr) return false;
      Ref one = Ref::steal(PyLong_FromLong(1));
      Ref nv = Ref::steal(PyNumber_Add(v.p, one.p));
      if (nv.p == nullptr) return false;
      rc = PyObject_SetAttr(e.obj.p, e.name.p, nv.p);
    }
    if (rc != 0) return false;
  }
  return true;
}

// The program's steps on `slots` (inputs already there). False with a Python error set: torch's
// own exception types for its errors (torch.OutOfMemoryError, ...), as the Python path raises.
bool run_steps(Program& p, std::vector<at::Tensor>& slots, void* stream,
               const std::vector<int64_t>& states) {
  HANDLE_TH_ERRORS
  size_t drawn = 0;
  for (const Step& step : p.steps) {
    if (step.kind == StepKind::kAlloc) {
      const Alloc& a = p.allocs[step.index];
      slots.push_back(at::empty_strided(a.sizes, a.strides, a.options));
    } else if (step.kind == StepKind::kView) {
      const View& v = p.views[step.index];
      slots.push_back(at::as_strided(slots[v.base], v.sizes, v.strides));
    } else if (step.kind == StepKind::kConst) {
      slots.push_back(p.consts[step.index]);
    } else {
      Launch& l = p.launches[step.index];
      char* buf = reinterpret_cast<char*>(l.buffer.data());
      std::memcpy(buf + kStreamOffset, &stream, sizeof(void*));
      if (l.draw.p != nullptr) {
        for (const auto& w : l.rng_writes) {
          int64_t v = states[drawn + w.second];
          std::memcpy(buf + w.first, &v, sizeof(int64_t));
        }
        drawn += kDrawn;
      }
      for (const auto& w : l.writes) {
        void* ptr = slots[w.second].data_ptr();
        std::memcpy(buf + w.first, &ptr, sizeof(void*));
      }
      if (launch(l) != 0) return false;
    }
  }
  return true;
  END_HANDLE_TH_ERRORS_RET(false)
}

// The generator states of the program's random-number launches, in launch order (seed, offset,
// state per launch): drawn before the replay writes any buffer.
bool draw_states(Program& p, std::vector<int64_t>& states) {
  for (auto& l : p.launches) {
    if (l.draw.p == nullptr) continue;
    Ref r = Ref::steal(PyObject_CallNoArgs(l.draw.p));
    if (r.p == nullptr) return false;
    if (!PyTuple_Check(r.p) || PyTuple_GET_SIZE(r.p) != kDrawn) {
      PyErr_SetString(PyExc_TypeError,
                      "pyfuser native runner: draw() must return (seed, offset, state)");
      return false;
    }
    for (Py_ssize_t k = 0; k < kDrawn; ++k) {
      long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(r.p, k));
      if (v == -1 && PyErr_Occurred()) return false;
      states.push_back(static_cast<int64_t>(v));
    }
  }
  return true;
}

PyObject* replay(Runner* self, Program& p, PyObject* inputs) {
  void* stream = nullptr;
  if (!p.launches.empty() || p.pinned) {
    Ref s = Ref::steal(PyObject_CallOneArg(g_driver.stream_fn, p.device.p));
    if (s.p == nullptr) return nullptr;
    stream = PyLong_AsVoidPtr(s.p);
    if (PyErr_Occurred()) return nullptr;
  }
  if (p.pinned && stream != p.pinned_stream) return call_slow(self, inputs);
  std::vector<int64_t> states;
  if (!draw_states(p, states)) return nullptr;
  PyObject** items;
  Py_ssize_t n;
  items_of(inputs, &items, &n);
  std::vector<at::Tensor> slots;
  slots.reserve(p.slots);
  for (Py_ssize_t i = 0; i < n; ++i) slots.push_back(THPVariable_Unpack(items[i]));
  if (!run_steps(p, slots, stream, states)) return nullptr;
  int unpack = self->unpack;
  Ref out = Ref::steal(PyList_New(static_cast<Py_ssize_t>(p.results.size())));
  if (out.p == nullptr) return nullptr;
  for (size_t k = 0; k < p.results.size(); ++k) {
    PyObject* t = THPVariable_Wrap(slots[p.results[k]]);
    if (t == nullptr) return nullptr;
    PyList_SET_ITEM(out.p, static_cast<Py_ssize_t>(k), t);
  }
  if (!apply_effects(p)) return nullptr;
  if (unpack == 1 && p.results.size() == 1) {
    PyObject* only = PyList_GET_ITEM(out.p, 0);
    Py_INCREF(only);
    return only;
  }
  if (unpack == 2) return PyList_AsTuple(out.p);
  return out.release();
}

// ---- building programs from Python specs ----------------------------------------------------
bool int64_list(PyObject* o, std::vector<int64_t>& v, const char* what) {
  Ref seq = Ref::steal(PySequence_Fast(o, what));
  if (seq.p == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.p);
  v.clear();
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq.p, i));
    if (x == -1 && PyErr_Occurred()) return false;
    v.push_back(static_cast<int64_t>(x));
  }
  return true;
}

bool slot_index(PyObject* o, size_t nslots, uint32_t* out) {
  long long s = PyLong_AsLongLong(o);
  if (s == -1 && PyErr_Occurred()) return false;
  if (s < 0 || static_cast<size_t>(s) >= nslots) {
    PyErr_Format(PyExc_ValueError, "slot %lld is not one of the %zu made so far", s, nslots);
    return false;
  }
  *out = static_cast<uint32_t>(s);
  return true;
}

bool parse_launch(PyObject* t, size_t nslots, Launch& l) {
  const char* kind;
  PyObject *fn, *ctx, *buffer, *offsets, *writes, *fail, *draw = Py_None, *rng_writes = Py_None;
  if (!PyArg_ParseTuple(t, "sOOOOOO|OO", &kind, &fn, &ctx, &buffer, &offsets, &writes, &fail,
                        &draw, &rng_writes))
    return false;
  l.fn = PyLong_AsVoidPtr(fn);
  l.ctx = PyLong_AsVoidPtr(ctx);
  if (PyErr_Occurred()) return false;
  char* data;
  Py_ssize_t size;
  if (PyBytes_AsStringAndSize(buffer, &data, &size) != 0) return false;
  if (size < static_cast<Py_ssize_t>(kStreamOffset + 8)) {
    PyErr_SetString(PyExc_ValueError, "launch buffer shorter than a CUlaunchConfig");
    return false;
  }
  l.buffer.assign((static_cast<size_t>(size) + 7) / 8, 0);
  std::memcpy(l.buffer.data(), data, static_cast<size_t>(size));
  std::vector<int64_t> offs;
  if (!int64_list(offsets, offs, "param offsets must be a sequence")) return false;
  for (int64_t o : offs) {
    if (o < 0 || o >= size) {
      PyErr_Format(PyExc_ValueError, "parameter offset %lld outside the %zd-byte buffer",
                   static_cast<long long>(o), size);
      return false;
    }
    l.param_offsets.push_back(static_cast<uint32_t>(o));
  }
  Ref ws = Ref::steal(PySequence_Fast(writes, "writes must be a sequence"));
  if (ws.p == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(ws.p); ++i) {
    PyObject *off, *slot;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(ws.p, i), "OO", &off, &slot)) return false;
    long long o = PyLong_AsLongLong(off);
    if (o == -1 && PyErr_Occurred()) return false;
    if (o < 0 || o + 8 > size) {
      PyErr_Format(PyExc_ValueError, "pointer write at %lld outside the %zd-byte buffer", o, size);
      return false;
    }
    uint32_t s;
    if (!slot_index(slot, nslots, &s)) return false;
    l.writes.emplace_back(static_cast<uint32_t>(o), s);
  }
  if (!PyCallable_Check(fail)) {
    PyErr_SetString(PyExc_TypeError, "launch step: fail must be callable");
    return false;
  }
  l.fail = Ref::borrow(fail);
  if (draw != Py_None) {
    if (!PyCallable_Check(draw)) {
      PyErr_SetString(PyExc_TypeError, "launch step: draw must be callable");
      return false;
    }
    l.draw = Ref::borrow(draw);
    Ref rs = Ref::steal(PySequence_Fast(rng_writes, "rng_writes must be a sequence"));
    if (rs.p == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(rs.p); ++i) {
      long long o;
      int which;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(rs.p, i), "Li", &o, &which)) return false;
      if (o < 0 || o + 8 > size || which < 0 || which >= kDrawn) {
        PyErr_Format(PyExc_ValueError, "rng write (%lld, %d) outside the %zd-byte buffer or not "
                     "0 (seed) / 1 (offset) / 2 (state)", o, which, size);
        return false;
      }
      l.rng_writes.emplace_back(static_cast<uint32_t>(o), static_cast<uint8_t>(which));
    }
  }
  return true;
}

bool parse_steps(PyObject* steps, Program& p) {
  Ref seq = Ref::steal(PySequence_Fast(steps, "steps must be a sequence"));
  if (seq.p == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq.p); ++i) {
    PyObject* t = PySequence_Fast_GET_ITEM(seq.p, i);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0))) {
      PyErr_SetString(PyExc_ValueError, "each step is a tuple starting with its kind");
      return false;
    }
    std::string kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0));
    if (kind == "alloc") {
      const char* k;
      PyObject *sizes, *strides, *like;
      if (!PyArg_ParseTuple(t, "sOOO", &k, &sizes, &strides, &like)) return false;
      if (!THPVariable_Check(like)) {
        PyErr_SetString(PyExc_TypeError, "alloc step: `like` must be a tensor");
        return false;
      }
      Alloc a;
      if (!int64_list(sizes, a.sizes, "sizes") || !int64_list(strides, a.strides, "strides"))
        return false;
      a.options = THPVariable_Unpack(like).options();
      p.steps.push_back({StepKind::kAlloc, static_cast<uint32_t>(p.allocs.size())});
      p.allocs.push_back(std::move(a));
      ++p.slots;
    } else if (kind == "view") {
      const char* k;
      PyObject *base, *sizes, *strides;
      if (!PyArg_ParseTuple(t, "sOOO", &k, &base, &sizes, &strides)) return false;
      View v;
      if (!slot_index(base, p.slots, &v.base)) return false;
      if (!int64_list(sizes, v.sizes, "sizes") || !int64_list(strides, v.strides, "strides"))
        return false;
      p.steps.push_back({StepKind::kView, static_cast<uint32_t>(p.views.size())});
      p.views.push_back(std::move(v));
      ++p.slots;
    } else if (kind == "const") {
      const char* k;
      PyObject *tensor, *stream;
      if (!PyArg_ParseTuple(t, "sOO", &k, &tensor, &stream)) return false;
      if (!THPVariable_Check(tensor)) {
        PyErr_SetString(PyExc_TypeError, "const step: a tensor");
        return false;
      }
      void* s = PyLong_AsVoidPtr(stream);
      if (PyErr_Occurred()) return false;
      if (p.pinned && s != p.pinned_stream) {
        PyErr_SetString(PyExc_ValueError, "const steps of one program on different streams");
        return false;
      }
      p.pinned = true;
      p.pinned_stream = s;
      p.steps.push_back({StepKind::kConst, static_cast<uint32_t>(p.consts.size())});
      p.consts.push_back(THPVariable_Unpack(tensor));
      ++p.slots;
    } else if (kind == "launch") {
      Launch l;
      if (!parse_launch(t, p.slots, l)) return false;
      p.steps.push_back({StepKind::kLaunch, static_cast<uint32_t>(p.launches.size())});
      p.launches.push_back(std::move(l));
    } else {
      PyErr_Format(PyExc_ValueError, "unknown step kind %s", kind.c_str());
      return false;
    }
  }
  return true;
}

bool parse_effects(PyObject* effects, Program& p) {
  Ref seq = Ref::steal(PySequence_Fast(effects, "effects must be a sequence"));
  if (seq.p == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq.p); ++i) {
    PyObject* t = PySequence_Fast_GET_ITEM(seq.p, i);
    const char* kind;
    PyObject *obj, *name, *value = Py_None;
    if (!PyArg_ParseTuple(t, "sOO|O", &kind, &obj, &name, &value)) return false;
    std::string k = kind;
    Effect e;
    if (k == "setattr" || k == "incr") {
      if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "effect: an attribute name must be a str");
        return false;
      }
      e.kind = k == "setattr" ? EffectKind::kSetAttr : EffectKind::kIncr;
    } else if (k == "setitem") {
      e.kind = EffectKind::kSetItem;
    } else {
      PyErr_Format(PyExc_ValueError, "unknown effect %s", kind);
      return false;
    }
    e.obj = Ref::borrow(obj);
    e.name = Ref::borrow(name);
    e.value = Ref::borrow(value);
    p.effects.push_back(std::move(e));
  }
  return true;
}

// ---- the Runner type ------------------------------------------------------------------------
PyObject* runner_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  Py_ssize_t n_inputs;
  PyObject *slow, *env = Py_None, *env_keys = nullptr;
  int grad_check = 0, unpack = 0;
  static const char* names[] = {"n_inputs", "slow", "env", "env_keys", "grad_check", "unpack",
                                nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nO|OO!pi", const_cast<char**>(names),
                                   &n_inputs, &slow, &env, &PyTuple_Type, &env_keys, &grad_check,
                                   &unpack))
    return nullptr;
  if (unpack < 0 || unpack > 2) {
    PyErr_SetString(PyExc_ValueError, "Runner: unpack is 0 (list), 1 (one result) or 2 (tuple)");
    return nullptr;
  }
  if (!PyCallable_Check(slow)) {
    PyErr_SetString(PyExc_TypeError, "Runner: slow must be callable");
    return nullptr;
  }
  if (env != Py_None && !PyDict_Check(env)) {
    PyErr_SetString(PyExc_TypeError, "Runner: env must be a dict or None");
    return nullptr;
  }
  Runner* self = reinterpret_cast<Runner*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->n_inputs = n_inputs;
  self->slow = Py_NewRef(slow);
  self->env = env == Py_None ? nullptr : Py_NewRef(env);
  self->env_keys = env_keys ? Py_NewRef(env_keys) : PyTuple_New(0);
  self->programs = new ProgramMap();
  self->scratch = new std::vector<int64_t>();
  self->grad_check = grad_check;
  self->unpack = unpack;
  return reinterpret_cast<PyObject*>(self);
}

int runner_traverse(Runner* self, visitproc visit, void* arg) {
  Py_VISIT(self->slow);
  Py_VISIT(self->env);
  Py_VISIT(self->env_keys);
  if (self->programs != nullptr) {
    for (auto& kv : *self->programs) {
      for (auto& e : kv.second->effects) {
        Py_VISIT(e.obj.p);
        Py_VISIT(e.name.p);
        Py_VISIT(e.value.p);
      }
      for (auto& l : kv.second->launches) {
        Py_VISIT(l.fail.p);
        Py_VISIT(l.draw.p);
      }
      Py_VISIT(kv.second->device.p);
    }
  }
  return 0;
}

int runner_clear(Runner* self) {
  if (self->programs != nullptr) {
    ProgramMap doomed;
    doomed.swap(*self->programs);  // references dropped after the map is consistent
  }
  Py_CLEAR(self->slow);
  Py_CLEAR(self->env);
  Py_CLEAR(self->env_keys);
  return 0;
}

void runner_dealloc(Runner* self) {
  PyObject_GC_UnTrack(self);
  runner_clear(self);
  delete self->programs;
  delete self->scratch;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* runner_run(Runner* self, PyObject* inputs) {
  if (self->slow == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Runner was cleared");
    return nullptr;
  }
  if (env_says_slow(self)) return call_slow(self, inputs);
  if (self->grad_check && at::GradMode::is_enabled()) return call_slow(self, inputs);
  bool ok;
  try {
    ok = make_key(self->n_inputs, inputs, *self->scratch);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) return call_slow(self, inputs);
  auto it = self->programs->find(*self->scratch);
  if (it == self->programs->end()) return call_slow(self, inputs);
  std::shared_ptr<Program> program = it->second;
  return replay(self, *program, inputs);
}

PyObject* runner_add(Runner* self, PyObject* args) {
  PyObject *inputs, *steps, *results, *effects, *device;
  if (!PyArg_ParseTuple(args, "OOOOO", &inputs, &steps, &results, &effects, &device)) return nullptr;
  std::vector<int64_t> key;
  bool ok;
  try {
    ok = make_key(self->n_inputs, inputs, key);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "Runner.add: inputs must be a list or tuple of %zd strided "
                 "tensors", self->n_inputs);
    return nullptr;
  }
  auto shared = std::make_shared<Program>();
  Program& p = *shared;
  p.slots = static_cast<size_t>(self->n_inputs);
  if (!parse_steps(steps, p) || !parse_effects(effects, p)) return nullptr;
  std::vector<int64_t> rs;
  if (!int64_list(results, rs, "results must be a sequence")) return nullptr;
  for (int64_t r : rs) {
    if (r < 0 || static_cast<size_t>(r) >= p.slots) {
      PyErr_Format(PyExc_ValueError, "result slot %lld is not one of the %zu made",
                   static_cast<long long>(r), p.slots);
      return nullptr;
    }
    p.results.push_back(static_cast<uint32_t>(r));
  }
  if (!p.launches.empty() && (g_driver.launch == nullptr || g_driver.stream_fn == nullptr)) {
    PyErr_SetString(PyExc_RuntimeError, "Runner.add: configure() the driver before adding launches");
    return nullptr;
  }
  p.device = Ref::borrow(device);
  p.place();
  self->programs->insert_or_assign(std::move(key), std::move(shared));
  Py_RETURN_NONE;
}

PyObject* runner_clear_programs(Runner* self, PyObject*) {
  ProgramMap doomed;
  doomed.swap(*self->programs);
  Py_RETURN_NONE;
}

PyObject* runner_key(Runner* self, PyObject* inputs) {
  std::vector<int64_t> key;
  bool ok;
  try {
    ok = make_key(self->n_inputs, inputs, key);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) Py_RETURN_NONE;
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(key.size()));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < key.size(); ++i)
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(key[i]));
  return t;
}

Py_ssize_t runner_len(Runner* self) { return static_cast<Py_ssize_t>(self->programs->size()); }

PyMethodDef runner_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(runner_run), METH_O,
     "run(inputs) -> outputs: replay the program of this key, else slow(inputs)"},
    {"add", reinterpret_cast<PyCFunction>(runner_add), METH_VARARGS,
     "add(inputs, steps, results, effects, device): record a program under inputs' key"},
    {"clear", reinterpret_cast<PyCFunction>(runner_clear_programs), METH_NOARGS,
     "forget every program"},
    {"key", reinterpret_cast<PyCFunction>(runner_key), METH_O,
     "key(inputs) -> the key as a tuple of ints, or None when inputs have none"},
    {nullptr, nullptr, 0, nullptr}};

PySequenceMethods runner_as_sequence = {reinterpret_cast<lenfunc>(runner_len)};

PyTypeObject RunnerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* configure(PyObject*, PyObject* args) {
  PyObject *launch_ex, *get_current, *push, *pop, *stream_fn;
  if (!PyArg_ParseTuple(args, "OOOOO", &launch_ex, &get_current, &push, &pop, &stream_fn))
    return nullptr;
  void* l = PyLong_AsVoidPtr(launch_ex);
  void* g = PyLong_AsVoidPtr(get_current);
  void* pu = PyLong_AsVoidPtr(push);
  void* po = PyLong_AsVoidPtr(pop);
  if (PyErr_Occurred()) return nullptr;
  if (!l || !g || !pu || !po || !PyCallable_Check(stream_fn)) {
    PyErr_SetString(PyExc_ValueError, "configure: four non-null addresses and a stream callable");
    return nullptr;
  }
  g_driver.launch = reinterpret_cast<LaunchEx>(l);
  g_driver.get_current = reinterpret_cast<CtxGet>(g);
  g_driver.push = reinterpret_cast<CtxPush>(pu);
  g_driver.pop = reinterpret_cast<CtxPop>(po);
  Py_XSETREF(g_driver.stream_fn, Py_NewRef(stream_fn));
  Py_RETURN_NONE;
}

// graph_key(args, keyed, any_device) -> bytes, or None: the signature of a graphed call's
// arguments (frontend/fx/cuda_graphs.py's GraphedInference.key, in one C++ pass). Per argument:
// a tensor's dtype, rank, sizes, strides, storage offset and, where keyed[i] is nonzero (a
// bytes mask), its data pointer; None, a bool, an int (that fits int64) by type and value, a
// float by type and bits; then the one CUDA device of the tensors. None where the Python key decides (another
// kind of argument, a tensor not on CUDA unless any_device, tensors on several devices, a
// tensor that is not strided): the caller then runs without a graph.
PyObject* graph_key(PyObject*, PyObject* args) {
  PyObject *seq, *keyed;
  int any_device;
  if (!PyArg_ParseTuple(args, "OSp", &seq, &keyed, &any_device)) return nullptr;
  PyObject** items;
  Py_ssize_t n;
  if (!items_of(seq, &items, &n)) Py_RETURN_NONE;
  const char* mask = PyBytes_AS_STRING(keyed);
  Py_ssize_t n_mask = PyBytes_GET_SIZE(keyed);
  std::vector<int64_t> key;
  key.reserve(static_cast<size_t>(n) * 10 + 1);
  int64_t device = -2;  // no tensor yet
  try {
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* a = items[i];
      if (THPVariable_Check(a)) {
        const at::Tensor& t = THPVariable_Unpack(a);
        if (!t.defined() || t.layout() != at::kStrided) Py_RETURN_NONE;
        int64_t d = t.is_cuda() ? static_cast<int64_t>(t.device().index()) : -1;
        if ((d < 0 && !any_device) || (device != -2 && d != device)) Py_RETURN_NONE;
        device = d;
        auto sizes = t.sizes();
        auto strides = t.strides();
        key.push_back(1);
        key.push_back(static_cast<int64_t>(t.scalar_type()));
        key.push_back(static_cast<int64_t>(sizes.size()));
        key.insert(key.end(), sizes.begin(), sizes.end());
        key.insert(key.end(), strides.begin(), strides.end());
        key.push_back(t.storage_offset());
        key.push_back(i < n_mask && mask[i] ? static_cast<int64_t>(
            reinterpret_cast<uintptr_t>(t.data_ptr())) : 0);
      } else if (a == Py_None) {
        key.push_back(2);
      } else if (PyBool_Check(a)) {
        key.push_back(3);
        key.push_back(a == Py_True);
      } else if (PyLong_Check(a)) {         // an int, or a subclass (an IntEnum) by its type
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
          PyErr_Clear();
          Py_RETURN_NONE;
        }
        key.push_back(4);
        key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(Py_TYPE(a))));
        key.push_back(v);
      } else if (PyFloat_Check(a)) {        // a float (or a subclass, by its type) by its bits
        double v = PyFloat_AS_DOUBLE(a);
        int64_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        key.push_back(5);
        key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(Py_TYPE(a))));
        key.push_back(bits);
      } else {
        Py_RETURN_NONE;
      }
    }
  } catch (const std::exception&) {
    Py_RETURN_NONE;
  }
  key.push_back(device);
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(key.data()),
                                   static_cast<Py_ssize_t>(key.size() * sizeof(int64_t)));
}

// A list or tuple of ints into `out`; false with a Python error set otherwise.
bool int_list(PyObject* seq, std::vector<int64_t>& out) {
  PyObject** items;
  Py_ssize_t n;
  if (!items_of(seq, &items, &n)) {
    PyErr_SetString(PyExc_TypeError, "sizes and strides are lists or tuples of ints");
    return false;
  }
  out.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

// hand_out(items) -> [tensor]: per item (storage, dtype, sizes, strides, storage offset) a new
// tensor on that storage (cuda_graphs_training.py hands a graph's saved tensors and gradients
// out of its memory this way: a backward hands out a hundred a call).
PyObject* hand_out(PyObject*, PyObject* seq) {
  PyObject** items;
  Py_ssize_t n;
  if (!items_of(seq, &items, &n)) {
    PyErr_SetString(PyExc_TypeError, "hand_out: a list or tuple of items");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  Ref out = Ref::steal(PyList_New(n));
  if (out.p == nullptr) return nullptr;
  std::vector<int64_t> sizes, strides;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* it = items[i];
    if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 5 ||
        !THPStorage_Check(PyTuple_GET_ITEM(it, 0)) || !THPDtype_Check(PyTuple_GET_ITEM(it, 1))) {
      PyErr_SetString(PyExc_TypeError,
                      "hand_out: items are (storage, dtype, sizes, strides, storage offset)");
      return nullptr;
    }
    const c10::Storage& st = THPStorage_Unpack(PyTuple_GET_ITEM(it, 0));
    auto dtype = reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(it, 1))->scalar_type;
    if (!int_list(PyTuple_GET_ITEM(it, 2), sizes) || !int_list(PyTuple_GET_ITEM(it, 3), strides))
      return nullptr;
    int64_t offset = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 4));
    if (offset == -1 && PyErr_Occurred()) return nullptr;
    // the tensor made directly on the storage (no empty tensor, no dispatched set_: a few
    // microseconds a tensor less on CUDA); the storage must hold what the view reaches
    int64_t reach = offset;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] == 0) { reach = -1; break; }
      reach += (sizes[d] - 1) * strides[d];
    }
    if (offset < 0 || sizes.size() != strides.size() ||
        (reach >= 0 && static_cast<size_t>(reach + 1) * c10::elementSize(dtype) > st.nbytes())) {
      PyErr_SetString(PyExc_ValueError, "hand_out: a view past its storage (or a negative "
                                        "offset, or sizes and strides of different lengths)");
      return nullptr;
    }
    c10::Storage keep = st;
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        std::move(keep), c10::DispatchKeySet(c10::computeDispatchKey(dtype, c10::kStrided,
                                                                     st.device())),
        c10::scalarTypeToTypeMeta(dtype));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    PyList_SET_ITEM(out.p, i, THPVariable_Wrap(std::move(t)));
  }
  return out.release();
  END_HANDLE_TH_ERRORS
}

// use_counts(storages) -> tuple of ints: each storage's reference count (what
// torch._C._storage_Use_Count gives), for the graphed training calls' check that nothing an
// earlier replay handed out is still in use (cuda_graphs_training.py).
PyObject* use_counts(PyObject*, PyObject* seq) {
  PyObject** items;
  Py_ssize_t n;
  if (!items_of(seq, &items, &n)) {
    PyErr_SetString(PyExc_TypeError, "use_counts: a list or tuple of storages");
    return nullptr;
  }
  Ref out = Ref::steal(PyTuple_New(n));
  if (out.p == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPStorage_Check(items[i])) {
      PyErr_SetString(PyExc_TypeError, "use_counts: a list or tuple of storages");
      return nullptr;
    }
    size_t c = THPStorage_Unpack(items[i]).use_count();
    PyObject* v = PyLong_FromSize_t(c);
    if (v == nullptr) return nullptr;
    PyTuple_SET_ITEM(out.p, i, v);
  }
  return out.release();
}

PyMethodDef module_methods[] = {
    {"use_counts", use_counts, METH_O,
     "use_counts([storage]) -> (int, ...): each storage's reference count"},
    {"hand_out", hand_out, METH_O,
     "hand_out([(storage, dtype, sizes, strides, offset)]) -> [tensor] (see fast_runner.cpp)"},
    {"graph_key", graph_key, METH_VARARGS,
     "graph_key(args, keyed mask bytes, any_device) -> bytes, or None (see fast_runner.cpp)"},
    {"configure", configure, METH_VARARGS,
     "configure(cuLaunchKernelEx, cuCtxGetCurrent, cuCtxPushCurrent, cuCtxPopCurrent addresses, "
     "stream(device) callable)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  RunnerType.tp_name = "pyfuser_native.Runner";
  RunnerType.tp_basicsize = sizeof(Runner);
  RunnerType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  RunnerType.tp_doc = "Replays a fusion's recorded programs by input key (see fast_runner.cpp).";
  RunnerType.tp_new = runner_new;
  RunnerType.tp_dealloc = reinterpret_cast<destructor>(runner_dealloc);
  RunnerType.tp_traverse = reinterpret_cast<traverseproc>(runner_traverse);
  RunnerType.tp_clear = reinterpret_cast<inquiry>(runner_clear);
  RunnerType.tp_methods = runner_methods;
  RunnerType.tp_as_sequence = &runner_as_sequence;
  if (PyType_Ready(&RunnerType) < 0) throw pybind11::error_already_set();
  Py_INCREF(&RunnerType);
  m.add_object("Runner", reinterpret_cast<PyObject*>(&RunnerType));
  if (PyModule_AddFunctions(m.ptr(), module_methods) < 0) throw pybind11::error_already_set();
}
