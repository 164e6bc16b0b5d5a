"""``python -m sglang_ddtree.testing.launch_server ARGS``: SGLang's ``launch_server`` with the
test-only changes of `sglang_ddtree.testing.inject` that the environment names, made in every
process of the server (its spawned processes import this module again, not SGLang's)."""

from sglang_ddtree.testing import inject

inject.install_from_env()

if __name__ == "__main__":
    import runpy

    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
