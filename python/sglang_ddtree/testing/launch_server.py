"""``python -m sglang_ddtree.testing.launch_server ARGS``: SGLang's ``launch_server`` with the
test-only changes of `sglang_ddtree.testing.inject` that the environment names, made in every
process of the server: SGLang's spawned processes import the main module again, so this module
stays the main one and calls SGLang's launch functions itself (running SGLang's module as the
main one would make the children import that instead)."""

from sglang_ddtree.testing import inject

inject.install_from_env()

if __name__ == "__main__":
    import os
    import sys

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    try:
        run_server(prepare_server_args(sys.argv[1:]))
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
