#!/usr/bin/env python3
"""The chat template oracle of tests/unit/chat_template_test.cpp.

Reads {"template": ..., "variables": {...}} as JSON on stdin and renders the template the way
transformers' apply_chat_template does: an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and the loopcontrols extension, HF's own `tojson` filter (json.dumps with
ensure_ascii=False) and the `raise_exception` and `strftime_now` globals. Prints the result
without adding a newline; on any exception prints its message and exits 3.

With --batch, stdin holds a JSON list of such requests instead and stdout gets a JSON list with,
for each, {"ok": true, "output": text} or {"ok": false, "error": "ExceptionType: message"}
(one Python start for a whole test).
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, request):
    return env.from_string(request["template"]).render(**request.get("variables", {}))


def main():
    env = make_environment()
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    if "--batch" in sys.argv[1:]:
        results = []
        for r in request:
            try:
                results.append({"ok": True, "output": render(env, r)})
            except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
                results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        sys.stdout.write(json.dumps(results))
        sys.stdout.flush()
        return
    try:
        text = render(env, request)
    except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
        sys.stdout.buffer.write(f"{type(exc).__name__}: {exc}".encode("utf-8"))
        sys.stdout.flush()
        sys.exit(3)
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
