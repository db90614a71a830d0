// Preloaded into kinesis-local (`node -r ./loopback.js`): it binds 0.0.0.0 by default, and the
// tests must listen on 127.0.0.1 only. It also ends with the test process that started it: the
// tests hold its standard input, which closes when they exit, however they exit.
const net = require("net");

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const [first] = args;
  if (first !== null && typeof first === "object") {
    args[0] = { ...first, host: "127.0.0.1" };
  } else if (typeof args[1] === "string") {
    args[1] = "127.0.0.1";
  } else {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};

// The local stack (scripts/local-stack) runs it detached and stops it by its PID instead.
if (!process.env.LOOPBACK_DETACHED) {
  process.stdin.on("end", () => process.exit(0));
  process.stdin.resume();
}
