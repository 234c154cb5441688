"""nbval's notebook kernels talk over Unix sockets in private folders (set up by the root conftest.py), so kernels
started at the same moment in two test workers cannot pick the same TCP port."""

import os

from nbval import kernel


def test_nbval_kernels_use_private_unix_sockets_and_run_code():
    kernels = [kernel.RunningKernel("python3"), kernel.RunningKernel("python3")]  # started while the other runs
    try:
        info = [running.km.get_connection_info() for running in kernels]
        assert [entry["transport"] for entry in info] == ["ipc", "ipc"], info
        folders = [os.path.dirname(entry["ip"]) for entry in info]
        assert folders[0] != folders[1] and all(os.path.isdir(folder) for folder in folders), folders
        for running in kernels:  # each kernel answers on its sockets
            msg_id = running.execute_cell_input("print(6 * 7)", allow_stdin=False)
            outputs = []
            while True:
                message = running.get_message("iopub", timeout=30)
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                if message["msg_type"] == "stream":
                    outputs.append(message["content"]["text"])
                if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                    break
            assert "".join(outputs).strip() == "42"
    finally:
        for running in kernels:
            running.stop()
