"""Starts moto (DynamoDB, SQS, ...) on 127.0.0.1 for the Rust tests.

Prints the port it listens on, then serves until its standard input closes: the test process
holds the other end, so the server ends with the tests however they end. `MOTO_THREADED=0`
serves one request at a time, which makes concurrent conditional writes behave as DynamoDB's do.
"""
import os
import sys
import threading

from werkzeug.serving import make_server

from moto.server import DomainDispatcherApplication, create_backend_app


def main() -> None:
    threaded = os.environ.get("MOTO_THREADED", "1") != "0"
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", 0, app, threaded=threaded)
    print(server.server_port, flush=True)

    def stop_when_the_tests_end() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=stop_when_the_tests_end, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
