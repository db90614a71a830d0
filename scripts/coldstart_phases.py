#!/usr/bin/env python3
"""Start-up alone, for telling apart builds of the ledger whose difference is a few hundred us.

A fake Lambda runtime API on 127.0.0.1 (no `cargo lambda`, no moto) hands each process one empty
Kinesis event (`{"Records": []}`, which the ledger answers without a request) and records the
moment its answer arrives; the processes of the binaries named on the command line are started
in turn, alternated, one warm-up round not counted. For each binary: the median wall time from
spawn to the answer, the median CPU time of the process by then (every thread,
`/proc/<pid>/task/*/schedstat`) and the median of its minor page faults (`/proc/<pid>/stat`).

`benches/coldstart.rs` is the benchmark of record (a real first batch, the certificate
sources, the series of BENCHMARKS.md); this script measures only what happens before the
first answer, closer to it (no relay through `cargo lambda`), for the phase figures of
BENCHMARKS.md, section 3.

Usage: scripts/coldstart_phases.py RUNS BINARY [BINARY...]
"""
import http.server
import os
import socketserver
import statistics
import subprocess
import sys
import threading
import time

answered = threading.Event()
last_answer = [b""]


class RuntimeApi(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.path.endswith("/invocation/next"):
            self.send_error(404)
            return
        if answered.is_set():
            time.sleep(5)  # the process is killed meanwhile
        body = b'{"Records": []}'
        self.send_response(200)
        self.send_header("Lambda-Runtime-Aws-Request-Id", "request-1")
        self.send_header("Lambda-Runtime-Deadline-Ms", str(int(time.time() * 1000) + 60_000))
        self.send_header("Lambda-Runtime-Invoked-Function-Arn",
                         "arn:aws:lambda:us-east-1:123456789012:function:_")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        last_answer[0] = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        answered.set()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, *args):
        pass  # a process killed mid-request


def cpu_ms(pid):
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError):
            pass
    return total / 1e6


def minor_faults(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def main():
    runs, binaries = int(sys.argv[1]), sys.argv[2:]
    server = Server(("127.0.0.1", 0), RuntimeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "PATH": os.environ["PATH"],
        "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{server.server_address[1]}",
        "AWS_LAMBDA_FUNCTION_NAME": "_",
        "AWS_LAMBDA_FUNCTION_VERSION": "1",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
        "LEASE_TABLE": "leases",
        "LEDGER_TABLE": "ledger",
        "DEAD_LETTER_QUEUE_URL": "http://127.0.0.1:9/queue",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    samples = {binary: ([], [], []) for binary in binaries}
    for run in range(runs + 1):
        for binary in binaries:
            answered.clear()
            start = time.perf_counter()
            process = subprocess.Popen([binary], env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if not answered.wait(30):
                sys.exit(f"{binary} did not answer")
            wall = (time.perf_counter() - start) * 1e3
            cpu, faults = cpu_ms(process.pid), minor_faults(process.pid)
            process.kill()
            process.wait()
            if b"batchItemFailures" not in last_answer[0]:
                sys.exit(f"{binary} answered {last_answer[0]!r}")
            if run > 0:
                for series, value in zip(samples[binary], (wall, cpu, faults)):
                    series.append(value)
    print(f"{runs} runs of each, alternated; medians")
    for binary, (wall, cpu, faults) in samples.items():
        print(f"{binary:50} wall {statistics.median(wall):7.2f} ms  "
              f"CPU {statistics.median(cpu):5.2f} ms  minor faults {statistics.median(faults):5.0f}")


if __name__ == "__main__":
    main()
