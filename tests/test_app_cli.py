"""app.py's command line: what a user sees when the server cannot start."""
import socket

import app


def test_a_port_in_use_is_one_sentence_not_a_traceback(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        rc = app.main(["--port", str(port), "--watch", str(tmp_path), "--fallback", ""])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port" in err
    assert "Traceback" not in err
