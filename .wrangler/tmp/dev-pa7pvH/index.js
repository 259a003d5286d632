var __defProp = Object.defineProperty;
var __name = (target, value) => __defProp(target, "name", { value, configurable: true });

// crates/redcount-worker/build/index.js
import { WorkerEntrypoint as ye } from "cloudflare:workers";
import Q from "./f5a28f894128c6723528463c6fa9e68efc27d371-index_bg.wasm";
var V = globalThis.__worker_init_state = { criticalError: false, instanceId: 0 };
var I = class {
  static {
    __name(this, "I");
  }
  __destroy_into_raw() {
    let e = this.__wbg_ptr;
    return this.__wbg_ptr = 0, ae.unregister(this), e;
  }
  free() {
    let e = this.__destroy_into_raw();
    c();
    try {
      _.__wbg_containerstartupoptions_free(e, 0);
    } catch (t) {
      s(t);
    }
  }
  get enableInternet() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_containerstartupoptions_enableInternet(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e === 16777215 ? void 0 : e !== 0;
  }
  get entrypoint() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_containerstartupoptions_entrypoint(this.__wbg_ptr);
    } catch (r) {
      s(r);
    }
    var t = we(e[0], e[1]);
    return _.__wbindgen_free(e[0], e[1] * 4, 4), t;
  }
  get env() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_containerstartupoptions_env(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e;
  }
  set enableInternet(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_containerstartupoptions_enableInternet(this.__wbg_ptr, u(e) ? 16777215 : e ? 1 : 0);
    } catch (t) {
      s(t);
    }
  }
  set entrypoint(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let t = ge(e, _.__wbindgen_malloc), r = h;
    c();
    try {
      _.__wbg_set_containerstartupoptions_entrypoint(this.__wbg_ptr, t, r);
    } catch (i) {
      s(i);
    }
  }
  set env(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_containerstartupoptions_env(this.__wbg_ptr, e);
    } catch (t) {
      s(t);
    }
  }
};
Symbol.dispose && (I.prototype[Symbol.dispose] = I.prototype.free);
var S = class {
  static {
    __name(this, "S");
  }
  __destroy_into_raw() {
    let e = this.__wbg_ptr;
    return this.__wbg_ptr = 0, fe.unregister(this), e;
  }
  free() {
    let e = this.__destroy_into_raw();
    c();
    try {
      _.__wbg_intounderlyingbytesource_free(e, 0);
    } catch (t) {
      s(t);
    }
  }
  get autoAllocateChunkSize() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.intounderlyingbytesource_autoAllocateChunkSize(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e >>> 0;
  }
  cancel() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e = this.__destroy_into_raw();
    c();
    try {
      _.intounderlyingbytesource_cancel(e);
    } catch (t) {
      s(t);
    }
  }
  pull(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let t;
    c();
    try {
      t = _.intounderlyingbytesource_pull(this.__wbg_ptr, e);
    } catch (r) {
      s(r);
    }
    return t;
  }
  start(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.intounderlyingbytesource_start(this.__wbg_ptr, e);
    } catch (t) {
      s(t);
    }
  }
  get type() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.intounderlyingbytesource_type(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return oe[e];
  }
};
Symbol.dispose && (S.prototype[Symbol.dispose] = S.prototype.free);
var k = class {
  static {
    __name(this, "k");
  }
  __destroy_into_raw() {
    let e = this.__wbg_ptr;
    return this.__wbg_ptr = 0, ue.unregister(this), e;
  }
  free() {
    let e = this.__destroy_into_raw();
    c();
    try {
      _.__wbg_intounderlyingsink_free(e, 0);
    } catch (t) {
      s(t);
    }
  }
  abort(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let t = this.__destroy_into_raw(), r;
    c();
    try {
      r = _.intounderlyingsink_abort(t, e);
    } catch (i) {
      s(i);
    }
    return r;
  }
  close() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e = this.__destroy_into_raw(), t;
    c();
    try {
      t = _.intounderlyingsink_close(e);
    } catch (r) {
      s(r);
    }
    return t;
  }
  write(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let t;
    c();
    try {
      t = _.intounderlyingsink_write(this.__wbg_ptr, e);
    } catch (r) {
      s(r);
    }
    return t;
  }
};
Symbol.dispose && (k.prototype[Symbol.dispose] = k.prototype.free);
var A = class {
  static {
    __name(this, "A");
  }
  __destroy_into_raw() {
    let e = this.__wbg_ptr;
    return this.__wbg_ptr = 0, be.unregister(this), e;
  }
  free() {
    let e = this.__destroy_into_raw();
    c();
    try {
      _.__wbg_intounderlyingsource_free(e, 0);
    } catch (t) {
      s(t);
    }
  }
  cancel() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e = this.__destroy_into_raw();
    c();
    try {
      _.intounderlyingsource_cancel(e);
    } catch (t) {
      s(t);
    }
  }
  pull(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let t;
    c();
    try {
      t = _.intounderlyingsource_pull(this.__wbg_ptr, e);
    } catch (r) {
      s(r);
    }
    return t;
  }
};
Symbol.dispose && (A.prototype[Symbol.dispose] = A.prototype.free);
var m = class n {
  static {
    __name(this, "n");
  }
  static __wrap(e) {
    let t = Object.create(n.prototype);
    return t.__wbg_ptr = e, Object.defineProperty(t, "__wbg_inst", { value: o, writable: true }), J.register(t, { ptr: e, instance: o }, t), t;
  }
  __destroy_into_raw() {
    let e = this.__wbg_ptr;
    return this.__wbg_ptr = 0, J.unregister(this), e;
  }
  free() {
    let e = this.__destroy_into_raw();
    c();
    try {
      _.__wbg_minifyconfig_free(e, 0);
    } catch (t) {
      s(t);
    }
  }
  get css() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_minifyconfig_css(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e !== 0;
  }
  get html() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_minifyconfig_html(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e !== 0;
  }
  get js() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_minifyconfig_js(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e !== 0;
  }
  set css(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_minifyconfig_css(this.__wbg_ptr, e);
    } catch (t) {
      s(t);
    }
  }
  set html(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_minifyconfig_html(this.__wbg_ptr, e);
    } catch (t) {
      s(t);
    }
  }
  set js(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_minifyconfig_js(this.__wbg_ptr, e);
    } catch (t) {
      s(t);
    }
  }
};
Symbol.dispose && (m.prototype[Symbol.dispose] = m.prototype.free);
var x = class {
  static {
    __name(this, "x");
  }
  __destroy_into_raw() {
    let e = this.__wbg_ptr;
    return this.__wbg_ptr = 0, de.unregister(this), e;
  }
  free() {
    let e = this.__destroy_into_raw();
    c();
    try {
      _.__wbg_r2range_free(e, 0);
    } catch (t) {
      s(t);
    }
  }
  get length() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_r2range_length(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e[0] === 0 ? void 0 : e[1];
  }
  get offset() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_r2range_offset(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e[0] === 0 ? void 0 : e[1];
  }
  get suffix() {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    let e;
    c();
    try {
      e = _.__wbg_get_r2range_suffix(this.__wbg_ptr);
    } catch (t) {
      s(t);
    }
    return e[0] === 0 ? void 0 : e[1];
  }
  set length(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_r2range_length(this.__wbg_ptr, !u(e), u(e) ? 0 : e);
    } catch (t) {
      s(t);
    }
  }
  set offset(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_r2range_offset(this.__wbg_ptr, !u(e), u(e) ? 0 : e);
    } catch (t) {
      s(t);
    }
  }
  set suffix(e) {
    if (this.__wbg_inst !== void 0 && this.__wbg_inst !== o) throw new Error("Invalid stale object from previous Wasm instance");
    c();
    try {
      _.__wbg_set_r2range_suffix(this.__wbg_ptr, !u(e), u(e) ? 0 : e);
    } catch (t) {
      s(t);
    }
  }
};
Symbol.dispose && (x.prototype[Symbol.dispose] = x.prototype.free);
function O() {
  o++, y = null, R = null, F = null, typeof numBytesDecoded < "u" && (numBytesDecoded = 0), typeof h < "u" && (h = 0), D = false, z = false, q = new WebAssembly.Instance(Q, Z()), _ = q.exports, _.__wbindgen_start();
}
__name(O, "O");
function X() {
  let n2;
  c();
  try {
    n2 = _.__worker_init_state();
  } catch (e) {
    s(e);
  }
  return n2;
}
__name(X, "X");
function Y(n2, e, t) {
  let r;
  c();
  try {
    r = _.fetch(n2, e, t);
  } catch (i) {
    s(i);
  }
  return r;
}
__name(Y, "Y");
function Z() {
  return { __proto__: null, "./index_bg.js": { __proto__: null, __wbg_Error_208446807d0d1e30: /* @__PURE__ */ __name(function(e, t) {
    return Error(w(e, t));
  }, "__wbg_Error_208446807d0d1e30"), __wbg_String_8564e559799eccda: /* @__PURE__ */ __name(function(e, t) {
    let r = String(t), i = v(r, _.__wbindgen_malloc, _.__wbindgen_realloc), a = h;
    d().setInt32((e >>> 0) + 4, a, true), d().setInt32((e >>> 0) + 0, i, true);
  }, "__wbg_String_8564e559799eccda"), __wbg___wbindgen_debug_string_f249a2a76caa9a55: /* @__PURE__ */ __name(function(e, t) {
    let r = te(t), i = v(r, _.__wbindgen_malloc, _.__wbindgen_realloc), a = h;
    d().setInt32((e >>> 0) + 4, a, true), d().setInt32((e >>> 0) + 0, i, true);
  }, "__wbg___wbindgen_debug_string_f249a2a76caa9a55"), __wbg___wbindgen_is_function_741ff2bb612836f5: /* @__PURE__ */ __name(function(e) {
    return typeof e == "function";
  }, "__wbg___wbindgen_is_function_741ff2bb612836f5"), __wbg___wbindgen_is_null_or_undefined_fb96af93c75460ae: /* @__PURE__ */ __name(function(e) {
    return e == null;
  }, "__wbg___wbindgen_is_null_or_undefined_fb96af93c75460ae"), __wbg___wbindgen_is_string_fc456fee5d3317de: /* @__PURE__ */ __name(function(e) {
    return typeof e == "string";
  }, "__wbg___wbindgen_is_string_fc456fee5d3317de"), __wbg___wbindgen_is_undefined_be5b34249ff1fc15: /* @__PURE__ */ __name(function(e) {
    return e === void 0;
  }, "__wbg___wbindgen_is_undefined_be5b34249ff1fc15"), __wbg___wbindgen_reinit_2fe0d0b9c1cc3c21: /* @__PURE__ */ __name(function() {
    z = true;
  }, "__wbg___wbindgen_reinit_2fe0d0b9c1cc3c21"), __wbg___wbindgen_string_get_7ce8eee7fd327545: /* @__PURE__ */ __name(function(e, t) {
    let r = t, i = typeof r == "string" ? r : void 0;
    var a = u(i) ? 0 : v(i, _.__wbindgen_malloc, _.__wbindgen_realloc), f = h;
    d().setInt32((e >>> 0) + 4, f, true), d().setInt32((e >>> 0) + 0, a, true);
  }, "__wbg___wbindgen_string_get_7ce8eee7fd327545"), __wbg___wbindgen_throw_4c88d8bf264fd984: /* @__PURE__ */ __name(function(e, t) {
    throw new WebAssembly.Exception(C, [new Error(w(e, t))]);
  }, "__wbg___wbindgen_throw_4c88d8bf264fd984"), __wbg__wbg_cb_unref_09736879a3f67559: /* @__PURE__ */ __name(function(e) {
    e._wbg_cb_unref();
  }, "__wbg__wbg_cb_unref_09736879a3f67559"), __wbg_append_ba9a4dc30a0323fd: /* @__PURE__ */ __name(function(e, t, r, i, a) {
    e.append(w(t, r), w(i, a));
  }, "__wbg_append_ba9a4dc30a0323fd"), __wbg_arrayBuffer_39a766224696fd9d: /* @__PURE__ */ __name(function(e) {
    return e.arrayBuffer();
  }, "__wbg_arrayBuffer_39a766224696fd9d"), __wbg_body_0da01a9a056907d8: /* @__PURE__ */ __name(function(e) {
    let t = e.body;
    return u(t) ? 0 : l(t);
  }, "__wbg_body_0da01a9a056907d8"), __wbg_buffer_aca05a93c046db1a: /* @__PURE__ */ __name(function(e) {
    return e.buffer;
  }, "__wbg_buffer_aca05a93c046db1a"), __wbg_byobRequest_18280c78e462544c: /* @__PURE__ */ __name(function(e) {
    let t = e.byobRequest;
    return u(t) ? 0 : l(t);
  }, "__wbg_byobRequest_18280c78e462544c"), __wbg_byteLength_c5f3c188d5252e5b: /* @__PURE__ */ __name(function(e) {
    return e.byteLength;
  }, "__wbg_byteLength_c5f3c188d5252e5b"), __wbg_byteOffset_63cdc7b38f33a45e: /* @__PURE__ */ __name(function(e) {
    return e.byteOffset;
  }, "__wbg_byteOffset_63cdc7b38f33a45e"), __wbg_call_a410eb4b59ed5965: /* @__PURE__ */ __name(function(e, t, r) {
    return e.call(t, r);
  }, "__wbg_call_a410eb4b59ed5965"), __wbg_cancel_b195250778e9d8e7: /* @__PURE__ */ __name(function(e) {
    return e.cancel();
  }, "__wbg_cancel_b195250778e9d8e7"), __wbg_catch_fd4c7ea14fde9d83: /* @__PURE__ */ __name(function(e, t) {
    return e.catch(t);
  }, "__wbg_catch_fd4c7ea14fde9d83"), __wbg_cause_4cdda1b55a30b227: /* @__PURE__ */ __name(function(e) {
    return e.cause;
  }, "__wbg_cause_4cdda1b55a30b227"), __wbg_cf_3eef96d446a499c0: /* @__PURE__ */ __name(function(e) {
    let t = e.cf;
    return u(t) ? 0 : l(t);
  }, "__wbg_cf_3eef96d446a499c0"), __wbg_cf_e4bf1d08e9961dec: /* @__PURE__ */ __name(function(e) {
    let t = e.cf;
    return u(t) ? 0 : l(t);
  }, "__wbg_cf_e4bf1d08e9961dec"), __wbg_close_294d3f727cb7a844: /* @__PURE__ */ __name(function(e) {
    e.close();
  }, "__wbg_close_294d3f727cb7a844"), __wbg_close_bf94aa7e38b9a94b: /* @__PURE__ */ __name(function(e) {
    e.close();
  }, "__wbg_close_bf94aa7e38b9a94b"), __wbg_constructor_76ad3e2c50d259de: /* @__PURE__ */ __name(function(e) {
    return e.constructor;
  }, "__wbg_constructor_76ad3e2c50d259de"), __wbg_done_57e08d0be6e30c02: /* @__PURE__ */ __name(function(e) {
    return e.done;
  }, "__wbg_done_57e08d0be6e30c02"), __wbg_enqueue_c11626eae1c54509: /* @__PURE__ */ __name(function(e, t) {
    e.enqueue(t);
  }, "__wbg_enqueue_c11626eae1c54509"), __wbg_error_9b95f63d905893d2: /* @__PURE__ */ __name(function(e, t) {
    console.error(e, t);
  }, "__wbg_error_9b95f63d905893d2"), __wbg_error_d1fc0193610e0e39: /* @__PURE__ */ __name(function(e) {
    console.error(e);
  }, "__wbg_error_d1fc0193610e0e39"), __wbg_fetch_8991a6a8ea67c83b: /* @__PURE__ */ __name(function(e, t, r, i) {
    return e.fetch(w(t, r), i);
  }, "__wbg_fetch_8991a6a8ea67c83b"), __wbg_fetch_a416b432a33cc077: /* @__PURE__ */ __name(function(e, t, r) {
    return e.fetch(t, r);
  }, "__wbg_fetch_a416b432a33cc077"), __wbg_getReader_3b3096cf504fce5e: /* @__PURE__ */ __name(function(e) {
    return e.getReader();
  }, "__wbg_getReader_3b3096cf504fce5e"), __wbg_get_0ae635d02d232017: /* @__PURE__ */ __name(function(e, t) {
    let r = Reflect.get(e, t);
    return u(r) ? 0 : l(r);
  }, "__wbg_get_0ae635d02d232017"), __wbg_get_2080c49015e35254: /* @__PURE__ */ __name(function(e, t) {
    return Reflect.get(e, t);
  }, "__wbg_get_2080c49015e35254"), __wbg_get_556f1c9a5c587e8c: /* @__PURE__ */ __name(function(e, t, r, i) {
    let a = t.get(w(r, i));
    var f = u(a) ? 0 : v(a, _.__wbindgen_malloc, _.__wbindgen_realloc), b = h;
    d().setInt32((e >>> 0) + 4, b, true), d().setInt32((e >>> 0) + 0, f, true);
  }, "__wbg_get_556f1c9a5c587e8c"), __wbg_get_done_3bf2b4a34e149301: /* @__PURE__ */ __name(function(e) {
    let t = e.done;
    return u(t) ? 16777215 : t ? 1 : 0;
  }, "__wbg_get_done_3bf2b4a34e149301"), __wbg_get_value_9454480da7066d61: /* @__PURE__ */ __name(function(e) {
    return e.value;
  }, "__wbg_get_value_9454480da7066d61"), __wbg_headers_5fc0106c076eb731: /* @__PURE__ */ __name(function(e) {
    return e.headers;
  }, "__wbg_headers_5fc0106c076eb731"), __wbg_headers_9ef80dd266706f48: /* @__PURE__ */ __name(function(e) {
    return e.headers;
  }, "__wbg_headers_9ef80dd266706f48"), __wbg_instanceId_65a51bedfd10160a: /* @__PURE__ */ __name(function(e) {
    return e.instanceId;
  }, "__wbg_instanceId_65a51bedfd10160a"), __wbg_instanceof_Error_74e3cca0c4a69161: /* @__PURE__ */ __name(function(e) {
    let t;
    try {
      t = e instanceof Error;
    } catch {
      t = false;
    }
    return t;
  }, "__wbg_instanceof_Error_74e3cca0c4a69161"), __wbg_instanceof_ReadableStream_ac28304925ec0f96: /* @__PURE__ */ __name(function(e) {
    let t;
    try {
      t = e instanceof ReadableStream;
    } catch {
      t = false;
    }
    return t;
  }, "__wbg_instanceof_ReadableStream_ac28304925ec0f96"), __wbg_instanceof_Response_5b0b4f7f1daeae51: /* @__PURE__ */ __name(function(e) {
    let t;
    try {
      t = e instanceof Response;
    } catch {
      t = false;
    }
    return t;
  }, "__wbg_instanceof_Response_5b0b4f7f1daeae51"), __wbg_keys_296846770c088f87: /* @__PURE__ */ __name(function(e) {
    return e.keys();
  }, "__wbg_keys_296846770c088f87"), __wbg_length_186163212ffe79c3: /* @__PURE__ */ __name(function(e) {
    return e.length;
  }, "__wbg_length_186163212ffe79c3"), __wbg_message_43d8c8f1d543a349: /* @__PURE__ */ __name(function(e) {
    return e.message;
  }, "__wbg_message_43d8c8f1d543a349"), __wbg_method_3d406ebab4dd9853: /* @__PURE__ */ __name(function(e, t) {
    let r = t.method, i = v(r, _.__wbindgen_malloc, _.__wbindgen_realloc), a = h;
    d().setInt32((e >>> 0) + 4, a, true), d().setInt32((e >>> 0) + 0, i, true);
  }, "__wbg_method_3d406ebab4dd9853"), __wbg_minifyconfig_new: /* @__PURE__ */ __name(function(e) {
    return m.__wrap(e);
  }, "__wbg_minifyconfig_new"), __wbg_name_d1fa514fdca6a975: /* @__PURE__ */ __name(function(e) {
    return e.name;
  }, "__wbg_name_d1fa514fdca6a975"), __wbg_name_fd11f69c917c5670: /* @__PURE__ */ __name(function(e) {
    return e.name;
  }, "__wbg_name_fd11f69c917c5670"), __wbg_new_13de428334042d26: /* @__PURE__ */ __name(function(e) {
    return new Uint8Array(e);
  }, "__wbg_new_13de428334042d26"), __wbg_new_277c27c26f94cbc2: /* @__PURE__ */ __name(function() {
    return new Headers();
  }, "__wbg_new_277c27c26f94cbc2"), __wbg_new_7075786089b89c5e: /* @__PURE__ */ __name(function() {
    return /* @__PURE__ */ new Map();
  }, "__wbg_new_7075786089b89c5e"), __wbg_new_787b9fb330d55d78: /* @__PURE__ */ __name(function(e, t) {
    return new Error(w(e, t));
  }, "__wbg_new_787b9fb330d55d78"), __wbg_new_cd4348290afae586: /* @__PURE__ */ __name(function() {
    return new Object();
  }, "__wbg_new_cd4348290afae586"), __wbg_new_typed_e09da9dae6ee5935: /* @__PURE__ */ __name(function(e, t) {
    try {
      var r = { a: e, b: t }, i = /* @__PURE__ */ __name((f, b) => {
        let g = r.a;
        r.a = 0;
        try {
          return ie(g, r.b, f, b);
        } finally {
          r.a = g;
        }
      }, "i");
      return new Promise(i);
    } finally {
      r.a = 0;
    }
  }, "__wbg_new_typed_e09da9dae6ee5935"), __wbg_new_with_byte_offset_and_length_3cd32055a417f095: /* @__PURE__ */ __name(function(e, t, r) {
    return new Uint8Array(e, t >>> 0, r >>> 0);
  }, "__wbg_new_with_byte_offset_and_length_3cd32055a417f095"), __wbg_new_with_length_01b143a7e5dd5a3e: /* @__PURE__ */ __name(function(e) {
    return new Uint8Array(e >>> 0);
  }, "__wbg_new_with_length_01b143a7e5dd5a3e"), __wbg_new_with_opt_buffer_source_and_init_efb63b64b37a12c7: /* @__PURE__ */ __name(function(e, t) {
    return new Response(e, t);
  }, "__wbg_new_with_opt_buffer_source_and_init_efb63b64b37a12c7"), __wbg_new_with_opt_readable_stream_and_init_383c64eccf9e9cc7: /* @__PURE__ */ __name(function(e, t) {
    return new Response(e, t);
  }, "__wbg_new_with_opt_readable_stream_and_init_383c64eccf9e9cc7"), __wbg_new_with_opt_str_and_init_6456bed24baae6fc: /* @__PURE__ */ __name(function(e, t, r) {
    return new Response(e === 0 ? void 0 : w(e, t), r);
  }, "__wbg_new_with_opt_str_and_init_6456bed24baae6fc"), __wbg_new_with_str_and_init_d9f6b5611184e16b: /* @__PURE__ */ __name(function(e, t, r) {
    return new Request(w(e, t), r);
  }, "__wbg_new_with_str_and_init_d9f6b5611184e16b"), __wbg_next_af5ac6a08bb0a717: /* @__PURE__ */ __name(function(e) {
    return e.next();
  }, "__wbg_next_af5ac6a08bb0a717"), __wbg_prototypesetcall_13162965d1fe7aa3: /* @__PURE__ */ __name(function(e, t, r) {
    Uint8Array.prototype.set.call(G(e, t), r);
  }, "__wbg_prototypesetcall_13162965d1fe7aa3"), __wbg_queueMicrotask_1e8503a8a690f0a3: /* @__PURE__ */ __name(function(e) {
    return e.queueMicrotask;
  }, "__wbg_queueMicrotask_1e8503a8a690f0a3"), __wbg_queueMicrotask_4a1a4d8dd332373b: /* @__PURE__ */ __name(function(e) {
    queueMicrotask(e);
  }, "__wbg_queueMicrotask_4a1a4d8dd332373b"), __wbg_read_e3bea75dace70752: /* @__PURE__ */ __name(function(e) {
    return e.read();
  }, "__wbg_read_e3bea75dace70752"), __wbg_releaseLock_eddf1401c763f0b9: /* @__PURE__ */ __name(function(e) {
    e.releaseLock();
  }, "__wbg_releaseLock_eddf1401c763f0b9"), __wbg_resolve_dbf78ab4942478b0: /* @__PURE__ */ __name(function(e) {
    return Promise.resolve(e);
  }, "__wbg_resolve_dbf78ab4942478b0"), __wbg_respond_d97c023ee981d1f5: /* @__PURE__ */ __name(function(e, t) {
    e.respond(t >>> 0);
  }, "__wbg_respond_d97c023ee981d1f5"), __wbg_set_2793479888329cb6: /* @__PURE__ */ __name(function(e, t, r) {
    return Reflect.set(e, t, r);
  }, "__wbg_set_2793479888329cb6"), __wbg_set_8282f7e0d2d01336: /* @__PURE__ */ __name(function(e, t, r) {
    return e.set(t, r);
  }, "__wbg_set_8282f7e0d2d01336"), __wbg_set_bcb0ec2400cfa22e: /* @__PURE__ */ __name(function(e, t, r, i, a) {
    e.set(w(t, r), w(i, a));
  }, "__wbg_set_bcb0ec2400cfa22e"), __wbg_set_body_877d5251e78ca815: /* @__PURE__ */ __name(function(e, t) {
    e.body = t;
  }, "__wbg_set_body_877d5251e78ca815"), __wbg_set_cache_7a23201e29cbd632: /* @__PURE__ */ __name(function(e, t) {
    e.cache = se[t];
  }, "__wbg_set_cache_7a23201e29cbd632"), __wbg_set_criticalError_c30445da7038dbf2: /* @__PURE__ */ __name(function(e, t) {
    e.criticalError = t !== 0;
  }, "__wbg_set_criticalError_c30445da7038dbf2"), __wbg_set_e4b9a833d288759a: /* @__PURE__ */ __name(function(e, t, r) {
    e[t] = r;
  }, "__wbg_set_e4b9a833d288759a"), __wbg_set_feb3714f475485ba: /* @__PURE__ */ __name(function(e, t, r) {
    e.set(G(t, r));
  }, "__wbg_set_feb3714f475485ba"), __wbg_set_headers_07f10dbe49bc0e77: /* @__PURE__ */ __name(function(e, t) {
    e.headers = t;
  }, "__wbg_set_headers_07f10dbe49bc0e77"), __wbg_set_headers_6d75a7df4eb22716: /* @__PURE__ */ __name(function(e, t) {
    e.headers = t;
  }, "__wbg_set_headers_6d75a7df4eb22716"), __wbg_set_instanceId_6f5f77d81e249b49: /* @__PURE__ */ __name(function(e, t) {
    e.instanceId = t >>> 0;
  }, "__wbg_set_instanceId_6f5f77d81e249b49"), __wbg_set_method_639e69af35614d36: /* @__PURE__ */ __name(function(e, t, r) {
    e.method = w(t, r);
  }, "__wbg_set_method_639e69af35614d36"), __wbg_set_redirect_a95a432ab7d10765: /* @__PURE__ */ __name(function(e, t) {
    e.redirect = ce[t];
  }, "__wbg_set_redirect_a95a432ab7d10765"), __wbg_set_signal_0b2eee78907e5ba7: /* @__PURE__ */ __name(function(e, t) {
    e.signal = t;
  }, "__wbg_set_signal_0b2eee78907e5ba7"), __wbg_set_status_bd9dc81d1c17b108: /* @__PURE__ */ __name(function(e, t) {
    e.status = t;
  }, "__wbg_set_status_bd9dc81d1c17b108"), __wbg_static_accessor_GLOBAL_THIS_003ee833af9699fc: /* @__PURE__ */ __name(function() {
    let e = typeof globalThis > "u" ? void 0 : globalThis;
    return u(e) ? 0 : l(e);
  }, "__wbg_static_accessor_GLOBAL_THIS_003ee833af9699fc"), __wbg_static_accessor_GLOBAL_e4293fb22cbe77da: /* @__PURE__ */ __name(function() {
    let e = typeof global > "u" ? void 0 : global;
    return u(e) ? 0 : l(e);
  }, "__wbg_static_accessor_GLOBAL_e4293fb22cbe77da"), __wbg_static_accessor_INIT_STATE_b2269150d11f01e0: /* @__PURE__ */ __name(function() {
    return V;
  }, "__wbg_static_accessor_INIT_STATE_b2269150d11f01e0"), __wbg_static_accessor_SELF_53bb20457401453d: /* @__PURE__ */ __name(function() {
    let e = typeof self > "u" ? void 0 : self;
    return u(e) ? 0 : l(e);
  }, "__wbg_static_accessor_SELF_53bb20457401453d"), __wbg_static_accessor_WINDOW_b5e0810bfecb7feb: /* @__PURE__ */ __name(function() {
    let e = typeof window > "u" ? void 0 : window;
    return u(e) ? 0 : l(e);
  }, "__wbg_static_accessor_WINDOW_b5e0810bfecb7feb"), __wbg_status_cb85b6c8d1769fa1: /* @__PURE__ */ __name(function(e) {
    return e.status;
  }, "__wbg_status_cb85b6c8d1769fa1"), __wbg_then_656f253a5dd7d8ea: /* @__PURE__ */ __name(function(e, t, r) {
    return e.then(t, r);
  }, "__wbg_then_656f253a5dd7d8ea"), __wbg_then_e3f7f2d365708be8: /* @__PURE__ */ __name(function(e, t) {
    return e.then(t);
  }, "__wbg_then_e3f7f2d365708be8"), __wbg_url_1be993c7b186415b: /* @__PURE__ */ __name(function(e, t) {
    let r = t.url, i = v(r, _.__wbindgen_malloc, _.__wbindgen_realloc), a = h;
    d().setInt32((e >>> 0) + 4, a, true), d().setInt32((e >>> 0) + 0, i, true);
  }, "__wbg_url_1be993c7b186415b"), __wbg_value_e0f328965e184931: /* @__PURE__ */ __name(function(e) {
    return e.value;
  }, "__wbg_value_e0f328965e184931"), __wbg_view_3b708d3bdaf3fc96: /* @__PURE__ */ __name(function(e) {
    let t = e.view;
    return u(t) ? 0 : l(t);
  }, "__wbg_view_3b708d3bdaf3fc96"), __wbg_webSocket_71791e807603b1e4: /* @__PURE__ */ __name(function(e) {
    let t = e.webSocket;
    return u(t) ? 0 : l(t);
  }, "__wbg_webSocket_71791e807603b1e4"), __wbindgen_generic_0000000000000001: /* @__PURE__ */ __name(function(e, t) {
    return K(e, t, re);
  }, "__wbindgen_generic_0000000000000001"), __wbindgen_generic_0000000000000002: /* @__PURE__ */ __name(function(e, t) {
    return K(e, t, _e);
  }, "__wbindgen_generic_0000000000000002"), __wbindgen_generic_0000000000000003: /* @__PURE__ */ __name(function(e) {
    return e;
  }, "__wbindgen_generic_0000000000000003"), __wbindgen_generic_0000000000000004: /* @__PURE__ */ __name(function(e, t) {
    return w(e, t);
  }, "__wbindgen_generic_0000000000000004"), __wbindgen_generic_0000000000000005: /* @__PURE__ */ __name(function(e) {
    return BigInt.asUintN(64, e);
  }, "__wbindgen_generic_0000000000000005"), __wbindgen_init_externref_table: /* @__PURE__ */ __name(function() {
    let e = _.__wbindgen_externrefs;
    e.set(0, void 0), e.set(1024, void 0), e.set(1025, null), e.set(1026, true), e.set(1027, false);
  }, "__wbindgen_init_externref_table"), __wbindgen_jstag: WebAssembly.JSTag, __wbindgen_rethrow_critical: /* @__PURE__ */ __name(function(e) {
    throw new Error("Critical error", { cause: e });
  }, "__wbindgen_rethrow_critical") } };
}
__name(Z, "Z");
var C = new WebAssembly.Tag({ parameters: ["externref"] });
var U;
var D = false;
function ee() {
  D = true;
  try {
    let n2 = B()[_.__abort_handler.value / 4];
    n2 && _.__wbindgen_export.get(n2)();
  } catch {
  }
}
__name(ee, "ee");
function s(n2) {
  throw n2 instanceof WebAssembly.Exception && n2.is(C) ? n2.getArg(C, 0) : (B()[U] = 1, ee(), n2);
}
__name(s, "s");
function c() {
  if (U ??= _.__instance_terminated.value / 4, B()[U]) {
    if (D || ee(), z) {
      O();
      return;
    }
    throw new Error("Module terminated");
  } else z && O();
}
__name(c, "c");
function re(n2, e, t) {
  c();
  try {
    _.wasm_bindgen__convert__closures_____invoke__hfef85ac99e1b895c(n2, e, t);
  } catch (r) {
    s(r);
  }
}
__name(re, "re");
function _e(n2, e, t) {
  let r;
  c();
  try {
    r = _.wasm_bindgen__convert__closures_____invoke__hc037e06db3c29bf4(n2, e, t);
  } catch (i) {
    s(i);
  }
  if (r[1]) throw le(r[0]);
}
__name(_e, "_e");
function ie(n2, e, t, r) {
  c();
  try {
    _.wasm_bindgen__convert__closures_____invoke__ha0e0f60e4f8e0fb9(n2, e, t, r);
  } catch (i) {
    s(i);
  }
}
__name(ie, "ie");
var oe = ["bytes"];
var se = ["default", "no-store", "reload", "no-cache", "force-cache", "only-if-cached"];
var ce = ["follow", "error", "manual"];
var o = 0;
var ae = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry(({ ptr: n2, instance: e }) => {
  e === o && _.__wbg_containerstartupoptions_free(n2, 1);
});
var fe = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry(({ ptr: n2, instance: e }) => {
  e === o && _.__wbg_intounderlyingbytesource_free(n2, 1);
});
var ue = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry(({ ptr: n2, instance: e }) => {
  e === o && _.__wbg_intounderlyingsink_free(n2, 1);
});
var be = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry(({ ptr: n2, instance: e }) => {
  e === o && _.__wbg_intounderlyingsource_free(n2, 1);
});
var J = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry(({ ptr: n2, instance: e }) => {
  e === o && _.__wbg_minifyconfig_free(n2, 1);
});
var de = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry(({ ptr: n2, instance: e }) => {
  e === o && _.__wbg_r2range_free(n2, 1);
});
function l(n2) {
  let e = _.__externref_table_alloc();
  return _.__wbindgen_externrefs.set(e, n2), e;
}
__name(l, "l");
var H = typeof FinalizationRegistry > "u" ? { register: /* @__PURE__ */ __name(() => {
}, "register"), unregister: /* @__PURE__ */ __name(() => {
}, "unregister") } : new FinalizationRegistry((n2) => {
  n2.instance === o && _.__wbindgen_destroy_closure(n2.a, n2.b);
});
function te(n2) {
  switch (typeof n2) {
    case "number":
    case "boolean":
    case "undefined":
      return `${n2}`;
    case "string":
      return JSON.stringify(n2);
    case "bigint":
      return `${n2}n`;
    case "symbol":
      return n2.description !== void 0 ? `Symbol(${n2.description})` : "Symbol";
    case "function":
      return typeof n2.name == "string" && n2.name !== "" ? `Function(${n2.name})` : "Function";
    case "object": {
      if (n2 === null) return "null";
      if (Array.isArray(n2)) return "[" + Array.from(n2, te).join(", ") + "]";
      if (n2 instanceof Error) return `${n2.name}: ${n2.message}
${n2.stack}`;
      let e = toString.call(n2), t = /\[object ([^\]]+)\]/.exec(e)?.[1];
      if (t === void 0) return e;
      if (t === "Object") try {
        return "Object(" + JSON.stringify(n2) + ")";
      } catch {
        return "Object";
      }
      return t;
    }
  }
}
__name(te, "te");
function we(n2, e) {
  n2 = n2 >>> 0;
  let t = d(), r = [];
  for (let i = n2; i < n2 + 4 * e; i += 4) r.push(_.__wbindgen_externrefs.get(t.getUint32(i, true)));
  return _.__externref_drop_slice(n2, e), r;
}
__name(we, "we");
function G(n2, e) {
  return n2 = n2 >>> 0, j().subarray(n2 / 1, n2 / 1 + e);
}
__name(G, "G");
var y = null;
function d() {
  return (y === null || y.buffer.detached === true || y.buffer.detached === void 0 && y.buffer !== _.memory.buffer) && (y = new DataView(_.memory.buffer)), y;
}
__name(d, "d");
var R = null;
function B() {
  return (R === null || R.byteLength === 0) && (R = new Int32Array(_.memory.buffer)), R;
}
__name(B, "B");
function w(n2, e) {
  return n2 = n2 >>> 0, he(j().subarray(n2, n2 + e));
}
__name(w, "w");
var F = null;
function j() {
  return (F === null || F.byteLength === 0) && (F = new Uint8Array(_.memory.buffer)), F;
}
__name(j, "j");
function u(n2) {
  return n2 == null;
}
__name(u, "u");
function K(n2, e, t) {
  let r = { a: n2, b: e, cnt: 1, instance: o }, i = /* @__PURE__ */ __name((...a) => {
    if (r.instance !== o) throw new Error("Cannot invoke closure from previous WASM instance");
    r.cnt++;
    let f = r.a;
    r.a = 0;
    try {
      return t(f, r.b, ...a);
    } finally {
      r.a = f, i._wbg_cb_unref();
    }
  }, "i");
  return i._wbg_cb_unref = () => {
    --r.cnt === 0 && (_.__wbindgen_destroy_closure(r.a, r.b), r.a = 0, H.unregister(r));
  }, H.register(i, r, r), i;
}
__name(K, "K");
function ge(n2, e) {
  let t = e(n2.length * 4, 4) >>> 0;
  for (let r = 0; r < n2.length; r++) {
    let i = l(n2[r]);
    d().setUint32(t + 4 * r, i, true);
  }
  return h = n2.length, t;
}
__name(ge, "ge");
function v(n2, e, t) {
  if (t === void 0) {
    let b = W.encode(n2), g = e(b.length, 1) >>> 0;
    return j().subarray(g, g + b.length).set(b), h = b.length, g;
  }
  let r = n2.length, i = e(r, 1) >>> 0, a = j(), f = 0;
  for (; f < r; f++) {
    let b = n2.charCodeAt(f);
    if (b > 127) break;
    a[i + f] = b;
  }
  if (f !== r) {
    f !== 0 && (n2 = n2.slice(f)), i = t(i, r, r = f + n2.length * 3, 1) >>> 0;
    let b = j().subarray(i + f, i + r), g = W.encodeInto(n2, b);
    f += g.written, i = t(i, r, f, 1) >>> 0;
  }
  return h = f, i;
}
__name(v, "v");
var z = false;
function le(n2) {
  let e = _.__wbindgen_externrefs.get(n2);
  return _.__externref_table_dealloc(n2), e;
}
__name(le, "le");
var ne = new TextDecoder("utf-8", { ignoreBOM: true });
ne.decode();
function he(n2) {
  return ne.decode(n2);
}
__name(he, "he");
var W = new TextEncoder();
"encodeInto" in W || (W.encodeInto = function(n2, e) {
  let t = W.encode(n2);
  return e.set(t), { read: n2.length, written: t.length };
});
var h = 0;
var q = new WebAssembly.Instance(Q, Z());
var _ = q.exports;
_.__wbindgen_start();
Error.stackTraceLimit = 100;
var p = X();
function N() {
  p.criticalError && (console.log("Reinitializing Wasm application"), O(), p.criticalError = false, p.instanceId++);
}
__name(N, "N");
addEventListener("error", (n2) => {
  $(n2.error);
});
function $(n2) {
  n2 instanceof WebAssembly.RuntimeError && (console.error("Critical", n2), p.criticalError = true);
}
__name($, "$");
var T = class extends ye {
  static {
    __name(this, "T");
  }
};
T.prototype.fetch = function(e) {
  return Y.call(this, e, this.env, this.ctx);
};
var me = { set: /* @__PURE__ */ __name((n2, e, t, r) => Reflect.set(n2.instance, e, t, r), "set"), has: /* @__PURE__ */ __name((n2, e) => Reflect.has(n2.instance, e), "has"), deleteProperty: /* @__PURE__ */ __name((n2, e) => Reflect.deleteProperty(n2.instance, e), "deleteProperty"), apply: /* @__PURE__ */ __name((n2, e, t) => Reflect.apply(n2.instance, e, t), "apply"), construct: /* @__PURE__ */ __name((n2, e, t) => Reflect.construct(n2.instance, e, t), "construct"), getPrototypeOf: /* @__PURE__ */ __name((n2) => Reflect.getPrototypeOf(n2.instance), "getPrototypeOf"), setPrototypeOf: /* @__PURE__ */ __name((n2, e) => Reflect.setPrototypeOf(n2.instance, e), "setPrototypeOf"), isExtensible: /* @__PURE__ */ __name((n2) => Reflect.isExtensible(n2.instance), "isExtensible"), preventExtensions: /* @__PURE__ */ __name((n2) => Reflect.preventExtensions(n2.instance), "preventExtensions"), getOwnPropertyDescriptor: /* @__PURE__ */ __name((n2, e) => Reflect.getOwnPropertyDescriptor(n2.instance, e), "getOwnPropertyDescriptor"), defineProperty: /* @__PURE__ */ __name((n2, e, t) => Reflect.defineProperty(n2.instance, e, t), "defineProperty"), ownKeys: /* @__PURE__ */ __name((n2) => Reflect.ownKeys(n2.instance), "ownKeys") };
var P = { construct(n2, e, t) {
  try {
    N();
    let r = { instance: Reflect.construct(n2, e, t), instanceId: p.instanceId, ctor: n2, args: e, newTarget: t };
    return new Proxy(r, { ...me, get(i, a, f) {
      i.instanceId !== p.instanceId && (i.instance = Reflect.construct(i.ctor, i.args, i.newTarget), i.instanceId = p.instanceId);
      let b = Reflect.get(i.instance, a, f);
      return typeof b != "function" ? b : b.constructor === Function ? new Proxy(b, { apply(g, M, L) {
        N();
        try {
          return g.apply(M, L);
        } catch (E) {
          throw $(E), E;
        }
      } }) : new Proxy(b, { async apply(g, M, L) {
        N();
        try {
          return await g.apply(M, L);
        } catch (E) {
          throw $(E), E;
        }
      } });
    } });
  } catch (r) {
    throw p.criticalError = true, r;
  }
} };
var Re = new Proxy(T, P);
var Fe = new Proxy(I, P);
var je = new Proxy(m, P);
var We = new Proxy(x, P);

// node_modules/wrangler/templates/middleware/middleware-ensure-req-body-drained.ts
var drainBody = /* @__PURE__ */ __name(async (request, env, _ctx, middlewareCtx) => {
  try {
    return await middlewareCtx.next(request, env);
  } finally {
    try {
      if (request.body !== null && !request.bodyUsed) {
        const reader = request.body.getReader();
        while (!(await reader.read()).done) {
        }
      }
    } catch (e) {
      console.error("Failed to drain the unused request body.", e);
    }
  }
}, "drainBody");
var middleware_ensure_req_body_drained_default = drainBody;

// node_modules/wrangler/templates/middleware/middleware-miniflare3-json-error.ts
function reduceError(e) {
  return {
    name: e?.name,
    message: e?.message ?? String(e),
    stack: e?.stack,
    cause: e?.cause === void 0 ? void 0 : reduceError(e.cause)
  };
}
__name(reduceError, "reduceError");
var jsonError = /* @__PURE__ */ __name(async (request, env, _ctx, middlewareCtx) => {
  try {
    return await middlewareCtx.next(request, env);
  } catch (e) {
    const error = reduceError(e);
    return Response.json(error, {
      status: 500,
      headers: { "MF-Experimental-Error-Stack": "true" }
    });
  }
}, "jsonError");
var middleware_miniflare3_json_error_default = jsonError;

// .wrangler/tmp/bundle-NqRp0o/middleware-insertion-facade.js
var __INTERNAL_WRANGLER_MIDDLEWARE__ = [
  middleware_ensure_req_body_drained_default,
  middleware_miniflare3_json_error_default
];
var middleware_insertion_facade_default = Re;

// node_modules/wrangler/templates/middleware/common.ts
var __facade_middleware__ = [];
function __facade_register__(...args) {
  __facade_middleware__.push(...args.flat());
}
__name(__facade_register__, "__facade_register__");
function __facade_invokeChain__(request, env, ctx, dispatch, middlewareChain) {
  const [head, ...tail] = middlewareChain;
  const middlewareCtx = {
    dispatch,
    next(newRequest, newEnv) {
      return __facade_invokeChain__(newRequest, newEnv, ctx, dispatch, tail);
    }
  };
  return head(request, env, ctx, middlewareCtx);
}
__name(__facade_invokeChain__, "__facade_invokeChain__");
function __facade_invoke__(request, env, ctx, dispatch, finalMiddleware) {
  return __facade_invokeChain__(request, env, ctx, dispatch, [
    ...__facade_middleware__,
    finalMiddleware
  ]);
}
__name(__facade_invoke__, "__facade_invoke__");

// .wrangler/tmp/bundle-NqRp0o/middleware-loader.entry.ts
var __Facade_ScheduledController__ = class ___Facade_ScheduledController__ {
  constructor(scheduledTime, cron, noRetry) {
    this.scheduledTime = scheduledTime;
    this.cron = cron;
    this.#noRetry = noRetry;
  }
  static {
    __name(this, "__Facade_ScheduledController__");
  }
  #noRetry;
  noRetry() {
    if (!(this instanceof ___Facade_ScheduledController__)) {
      throw new TypeError("Illegal invocation");
    }
    this.#noRetry();
  }
};
function wrapExportedHandler(worker) {
  if (__INTERNAL_WRANGLER_MIDDLEWARE__ === void 0 || __INTERNAL_WRANGLER_MIDDLEWARE__.length === 0) {
    return worker;
  }
  for (const middleware of __INTERNAL_WRANGLER_MIDDLEWARE__) {
    __facade_register__(middleware);
  }
  const fetchDispatcher = /* @__PURE__ */ __name(function(request, env, ctx) {
    if (worker.fetch === void 0) {
      throw new Error("Handler does not export a fetch() function.");
    }
    return worker.fetch(request, env, ctx);
  }, "fetchDispatcher");
  return {
    ...worker,
    fetch(request, env, ctx) {
      const dispatcher = /* @__PURE__ */ __name(function(type, init) {
        if (type === "scheduled" && worker.scheduled !== void 0) {
          const controller = new __Facade_ScheduledController__(
            Date.now(),
            init.cron ?? "",
            () => {
            }
          );
          return worker.scheduled(controller, env, ctx);
        }
      }, "dispatcher");
      return __facade_invoke__(request, env, ctx, dispatcher, fetchDispatcher);
    }
  };
}
__name(wrapExportedHandler, "wrapExportedHandler");
function wrapWorkerEntrypoint(klass) {
  if (__INTERNAL_WRANGLER_MIDDLEWARE__ === void 0 || __INTERNAL_WRANGLER_MIDDLEWARE__.length === 0) {
    return klass;
  }
  for (const middleware of __INTERNAL_WRANGLER_MIDDLEWARE__) {
    __facade_register__(middleware);
  }
  return class extends klass {
    #fetchDispatcher = /* @__PURE__ */ __name((request, env, ctx) => {
      this.env = env;
      this.ctx = ctx;
      if (super.fetch === void 0) {
        throw new Error("Entrypoint class does not define a fetch() function.");
      }
      return super.fetch(request);
    }, "#fetchDispatcher");
    #dispatcher = /* @__PURE__ */ __name((type, init) => {
      if (type === "scheduled" && super.scheduled !== void 0) {
        const controller = new __Facade_ScheduledController__(
          Date.now(),
          init.cron ?? "",
          () => {
          }
        );
        return super.scheduled(controller);
      }
    }, "#dispatcher");
    fetch(request) {
      return __facade_invoke__(
        request,
        this.env,
        this.ctx,
        this.#dispatcher,
        this.#fetchDispatcher
      );
    }
  };
}
__name(wrapWorkerEntrypoint, "wrapWorkerEntrypoint");
var WRAPPED_ENTRY;
if (typeof middleware_insertion_facade_default === "object") {
  WRAPPED_ENTRY = wrapExportedHandler(middleware_insertion_facade_default);
} else if (typeof middleware_insertion_facade_default === "function") {
  WRAPPED_ENTRY = wrapWorkerEntrypoint(middleware_insertion_facade_default);
}
var middleware_loader_entry_default = WRAPPED_ENTRY;
export {
  Fe as ContainerStartupOptions,
  je as MinifyConfig,
  We as R2Range,
  __INTERNAL_WRANGLER_MIDDLEWARE__,
  middleware_loader_entry_default as default
};
//# sourceMappingURL=index.js.map
