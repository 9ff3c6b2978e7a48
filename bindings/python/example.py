#!/usr/bin/env python3
"""Streams generated text: example.py [MODEL.cact] [PROMPT]

Without a model argument it runs the demo model ($NEEDLE_DEMO_MODEL, else the repository's
build/models/needle-demo.cact: the trained tool-calling demo model, prompted without the
chat template)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.environ.get("NEEDLE_DEMO_MODEL",
                             os.path.join(here, "..", "..", "build", "models", "needle-demo.cact"))
    path = sys.argv[1] if len(sys.argv) > 1 else default
    prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"

    def show(token, text):
        sys.stdout.write(text)
        sys.stdout.flush()
        return False  # keep going

    print("needle %s (ABI %d), model %s" % (needle.version(), needle.abi_version(), path))
    try:
        with needle.Model(path) as model, model.new_state() as state:
            result = state.generate(prompt, max_tokens=32, temperature=0.8, seed=7, callback=show)
    except needle.NeedleError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    print("\n[%d prompt tokens, %d generated, stop reason %d]"
          % (result.prompt_tokens, result.generated_tokens, result.stop_reason))
    return 0


if __name__ == "__main__":
    sys.exit(main())
