// microagent's JavaScript runner, driven by its kernel
// (javascript_kernel.py): one cell per stdin line ({"code": ...}), run in
// this process's own global context, so what one cell defines the next
// sees; each cell's printed text, then its outcome, go back as JSON lines
// on the descriptor named by the first argument.
'use strict';

const fs = require('fs');
const util = require('util');
const vm = require('vm');
const readline = require('readline');
const { createRequire } = require('module');

// The outcome pipe, opened again close-on-exec (libuv opens so) and the
// inherited descriptor closed: a child process the code starts must not
// hold it, or node's end would not end the pipe.
const OUTCOMES = (() => {
  const inherited = Number(process.argv[2]);
  const own = fs.openSync(`/proc/self/fd/${inherited}`, 'w');
  fs.closeSync(inherited);
  return own;
})();
// A result's text past this is cut (the host bounds it again).
const MAX_VALUE_CHARS = 1 << 20;
const INTERRUPTED = 'ERR_SCRIPT_EXECUTION_INTERRUPTED';

function send(message) {
  const bytes = Buffer.from(JSON.stringify(message) + '\n');
  let written = 0;
  while (written < bytes.length) {
    try {
      written += fs.writeSync(OUTCOMES, bytes, written);
    } catch (e) {
      if (e.code !== 'EAGAIN') process.exit(1);
    }
  }
}

// What the code prints (console, process.stdout and stderr) comes back
// with its cell; a child process's own output goes to the kernel's.
for (const [stream, kind] of [[process.stdout, 'out'], [process.stderr, 'err']]) {
  stream.write = (chunk, encoding, done) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    send({ t: kind, s: text });
    const callback = typeof encoding === 'function' ? encoding : done;
    if (typeof callback === 'function') process.nextTick(callback);
    return true;
  };
}

// The code's modules are found from its working directory.
globalThis.require = createRequire(process.cwd() + '/');

// A SIGINT between cells, or while a cell awaits, is the interrupt of the
// cell under way (a running script is stopped by breakOnSigint instead).
let stopAwaiting = null;
process.on('SIGINT', () => {
  if (stopAwaiting) stopAwaiting();
});

function interrupted() {
  const e = new Error('Script execution was interrupted by SIGINT');
  e.code = INTERRUPTED;
  return e;
}

async function settle(value) {
  if (!value || typeof value.then !== 'function') return value;
  return Promise.race([
    value,
    new Promise((_, reject) => {
      stopAwaiting = () => reject(interrupted());
    }),
  ]).finally(() => {
    stopAwaiting = null;
  });
}

function describe(value) {
  if (value === undefined) return null;
  const text = util.inspect(value, { depth: 4, maxArrayLength: 200, maxStringLength: 100000 });
  return text.length > MAX_VALUE_CHARS ? text.slice(0, MAX_VALUE_CHARS) + ' [cut]' : text;
}

function failure(e) {
  if (e && e.code === INTERRUPTED) {
    return { t: 'done', ok: false, name: 'Interrupted', message: 'the cell was interrupted', stack: '' };
  }
  const isError = e instanceof Error;
  const name = isError ? e.name : 'Uncaught';
  const message = isError ? e.message : util.inspect(e);
  // Only the cell's own frames: not this runner's.
  const stack = (isError && e.stack ? e.stack : `${name}: ${message}`)
    .split('\n')
    .filter((line) => !line.includes(__filename) && !line.includes('(node:'))
    .join('\n');
  return { t: 'done', ok: false, name, message, stack };
}

async function runCell(line) {
  let code;
  try {
    code = JSON.parse(line).code;
  } catch (e) {
    send({ t: 'done', ok: false, name: 'BadRequest', message: 'not a JSON cell', stack: '' });
    return;
  }
  try {
    const value = vm.runInThisContext(String(code), {
      filename: 'cell',
      breakOnSigint: true,
      displayErrors: false,
    });
    send({ t: 'done', ok: true, value: describe(await settle(value)) });
  } catch (e) {
    send(failure(e));
  }
}

// A cell's rejected promise nobody awaited is reported, not fatal.
process.on('unhandledRejection', (reason) => {
  send({ t: 'err', s: `Unhandled promise rejection: ${util.inspect(reason)}\n` });
});
process.on('uncaughtException', (e) => {
  send({ t: 'err', s: `Uncaught exception: ${e && e.stack ? e.stack : util.inspect(e)}\n` });
});

let queue = Promise.resolve();
const cells = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
cells.on('line', (line) => {
  queue = queue.then(() => runCell(line));
});
cells.on('close', () => queue.then(() => process.exit(0)));
