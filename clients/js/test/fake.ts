/**
 * A fake lockservice node for tests: it records every line it receives
 * (per connection, with the time), and answers them with a small model of
 * the protocol (exclusive, read and semaphore keys, FIFO queues, waits, leases,
 * `C` withdraw, `O` observe with holder names, `I`, `P`), unless a test's
 * hook answers first. It can play a standby (`M` redirects), stall, drop
 * connections, stop listening, and speak TLS.
 */

import * as net from "node:net";
import * as tls from "node:tls";

/** The longest delay a `setTimeout` holds; the fake never runs out a longer wait or lease. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export interface Received {
  conn: FakeConn;
  line: string;
  at: number;
  index: number;
}

export class FakeConn {
  readonly id: number;
  readonly socket: net.Socket;
  readonly openedAt = performance.now();
  name: string | null = null;
  closed = false;
  readonly lines: string[] = [];

  constructor(id: number, socket: net.Socket) {
    this.id = id;
    this.socket = socket;
  }

  send(line: string): void {
    if (!this.closed && !this.socket.destroyed) this.socket.write(`${line}\n`);
  }

  destroy(): void {
    this.socket.destroy();
  }
}

export interface FakeOptions {
  /** Serve TLS with these options (cert, key, ca, requestCert...). */
  tls?: tls.TlsOptions;
  /** Listen on this port (to come back on the same address). */
  port?: number;
  /** Play a standby: answer A/R/N/C/O with `M op key <redirect>` (`*`: no active known). */
  redirect?: string | null;
}

type Hook = (conn: FakeConn, line: string, fields: string[]) => boolean | void;

export class FakeServer {
  server!: net.Server;
  port = 0;
  readonly conns: FakeConn[] = [];
  readonly received: Received[] = [];
  /** Times (performance.now()) at which connections were accepted. */
  readonly accepts: number[] = [];
  /** Answers first; return true when it answered (the model then stays out). */
  hook: Hook | null = null;
  /** Never answer anything (a stalled node). */
  silent = false;
  /** Accept and close at once (an attempt that fails). */
  slam = false;
  redirect: string | null;
  readonly model = new Model();
  private readonly tlsOptions: tls.TlsOptions | undefined;
  private nextId = 0;
  private lineWaiters = new Set<() => void>();

  private constructor(options: FakeOptions) {
    this.tlsOptions = options.tls;
    this.redirect = options.redirect ?? null;
  }

  static async start(options: FakeOptions = {}): Promise<FakeServer> {
    const fake = new FakeServer(options);
    await fake.listen(options.port ?? 0);
    return fake;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  get live(): FakeConn[] {
    return this.conns.filter((c) => !c.closed);
  }

  async listen(port: number): Promise<void> {
    const onSocket = (socket: net.Socket): void => this.accept(socket);
    this.server = this.tlsOptions ? tls.createServer(this.tlsOptions, onSocket) : net.createServer(onSocket);
    if (this.tlsOptions) this.server.on("tlsClientError", () => {});
    await new Promise<void>((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(port, "127.0.0.1", () => resolve());
    });
    this.port = (this.server.address() as net.AddressInfo).port;
  }

  /** Stops accepting (connections are then refused); live ones stay. */
  async stopListening(): Promise<void> {
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Closes every live connection (the node's side). */
  dropAll(): void {
    for (const c of this.live) c.destroy();
  }

  async close(): Promise<void> {
    this.dropAll();
    this.model.stop();
    await new Promise<void>((resolve) => {
      if (!this.server.listening) resolve();
      else this.server.close(() => resolve());
    });
  }

  private accept(socket: net.Socket): void {
    this.accepts.push(performance.now());
    if (this.slam) {
      socket.destroy();
      return;
    }
    const conn = new FakeConn(++this.nextId, socket);
    this.conns.push(conn);
    socket.setNoDelay(true);
    socket.setEncoding("utf8");
    let buffer = "";
    socket.on("data", (chunk: string) => {
      buffer += chunk;
      let nl: number;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, "");
        buffer = buffer.slice(nl + 1);
        if (line === "") continue;
        conn.lines.push(line);
        this.received.push({ conn, line, at: performance.now(), index: this.received.length });
        for (const w of [...this.lineWaiters]) w();
        this.answer(conn, line);
      }
    });
    socket.on("error", () => {});
    socket.on("end", () => socket.end());
    socket.on("close", () => {
      conn.closed = true;
      this.model.dropConnection(conn);
      for (const w of [...this.lineWaiters]) w();
    });
  }

  private answer(conn: FakeConn, line: string): void {
    const fields = line.split(" ");
    if (this.hook && this.hook(conn, line, fields) === true) return;
    if (this.silent) return;
    const op = fields[0]!;
    if (this.redirect !== null && ["A", "R", "N", "C", "O"].includes(op) && fields.length >= 2) {
      conn.send(`M ${op} ${fields[1]} ${this.redirect}`);
      return;
    }
    this.model.handle(conn, fields);
  }

  /** Resolves with the first received line (from `from` on) that `match` takes; rejects after `ms`. */
  waitLine(match: (line: string, conn: FakeConn) => boolean, ms = 5000, from = 0): Promise<Received> {
    return new Promise<Received>((resolve, reject) => {
      const check = (): boolean => {
        for (let i = from; i < this.received.length; i++) {
          const r = this.received[i]!;
          if (match(r.line, r.conn)) {
            finish();
            resolve(r);
            return true;
          }
        }
        return false;
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`no matching line within ${ms} ms; received: ${JSON.stringify(this.received.map((r) => `${r.conn.id}: ${r.line}`))}`));
      }, ms);
      const finish = (): void => {
        clearTimeout(timer);
        this.lineWaiters.delete(waiter);
      };
      const waiter = (): void => void check();
      if (check()) return;
      this.lineWaiters.add(waiter);
    });
  }

  /** Lines received matching `re`, in order. */
  linesMatching(re: RegExp): Received[] {
    return this.received.filter((r) => re.test(r.line));
  }
}

/** Polls `condition` every 10 ms; rejects after `ms`. */
export async function waitFor(condition: () => boolean, ms = 5000, what = "condition"): Promise<void> {
  const until = performance.now() + ms;
  while (!condition()) {
    if (performance.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

interface Grant {
  token: bigint;
  holder: string;
  timer: NodeJS.Timeout | null;
}

interface Waiter {
  conn: FakeConn;
  share: "x" | "r" | number;
  lease: number;
  timer: NodeJS.Timeout | null;
}

interface KeyState {
  kind: "rw" | number;
  /** token -> grant, with the share of each. */
  grants: Map<bigint, Grant & { share: "x" | "r" | number }>;
  queue: Waiter[];
}

interface Observer {
  conn: FakeConn;
  key: string;
  token: string;
  timer: NodeJS.Timeout | null;
}

/** A small model of an active node. */
export class Model {
  nextToken = 1796000000000000n;
  /** Set to skip leases' expiry (tests that hold keys for long). */
  expire = true;
  readonly keys = new Map<string, KeyState>();
  private readonly observers = new Set<Observer>();

  stop(): void {
    for (const state of this.keys.values()) {
      for (const g of state.grants.values()) if (g.timer) clearTimeout(g.timer);
      for (const w of state.queue) if (w.timer) clearTimeout(w.timer);
    }
    for (const o of this.observers) if (o.timer) clearTimeout(o.timer);
    this.keys.clear();
    this.observers.clear();
  }

  newest(key: string): { token: bigint; holder: string } {
    const state = this.keys.get(key);
    let best: { token: bigint; holder: string } = { token: 0n, holder: "-" };
    if (state) for (const g of state.grants.values()) if (g.token > best.token) best = { token: g.token, holder: g.holder };
    return best;
  }

  /** Grants a key to a named holder from outside (a test's other client). */
  grantTo(key: string, holder: string, lease = 3600): bigint {
    const state = this.keys.get(key) ?? { kind: "rw" as const, grants: new Map(), queue: [] };
    this.keys.set(key, state);
    const before = this.newest(key).token;
    const token = this.nextToken++;
    state.grants.set(token, { token, holder, share: "x", timer: this.leaseTimer(key, token, lease) });
    if (this.newest(key).token !== before) this.notify(key);
    return token;
  }

  releaseToken(key: string, token: bigint): boolean {
    const state = this.keys.get(key);
    const grant = state?.grants.get(token);
    if (!state || !grant) return false;
    if (grant.timer) clearTimeout(grant.timer);
    const before = this.newest(key).token;
    state.grants.delete(token);
    this.serve(key);
    if (this.newest(key).token !== before) this.notify(key);
    this.cleanup(key);
    return true;
  }

  handle(conn: FakeConn, f: string[]): void {
    const op = f[0];
    const key = f[1] ?? "*";
    switch (op) {
      case "P":
        conn.send(`P ${key}`);
        return;
      case "I":
        if (key === "-" || f.length !== 2) {
          conn.send(`E I ${key} bad name`);
          return;
        }
        conn.name = key;
        conn.send(`I ${key}`);
        return;
      case "A":
        this.acquire(conn, key, f);
        return;
      case "R": {
        const ok = f.length === 3 && this.releaseToken(key, BigInt(f[2]!));
        conn.send(`R ${key} ${ok ? "OK" : "STALE"}`);
        return;
      }
      case "N": {
        const grant = this.keys.get(key)?.grants.get(BigInt(f[2] ?? "0"));
        if (!grant || f.length !== 4) {
          conn.send(`N ${key} STALE`);
          return;
        }
        if (grant.timer) clearTimeout(grant.timer);
        grant.timer = this.leaseTimer(key, grant.token, Number(f[3]));
        conn.send(`N ${key} OK`);
        return;
      }
      case "C": {
        const state = this.keys.get(key);
        const at = state ? state.queue.findIndex((w) => w.conn === conn) : -1;
        if (!state || at < 0) {
          conn.send(`C ${key} NONE`);
          return;
        }
        const [w] = state.queue.splice(at, 1);
        if (w!.timer) clearTimeout(w!.timer);
        conn.send(`T ${key}`);
        conn.send(`C ${key} OK`);
        this.serve(key);
        this.cleanup(key);
        return;
      }
      case "O": {
        const newest = this.newest(key);
        const token = f[2] ?? "?";
        if (token === "?" || token !== newest.token.toString()) {
          conn.send(`O ${key} ${newest.token} ${newest.holder}`);
          return;
        }
        const wait = Number(f[3] ?? "0");
        const observer: Observer = { conn, key, token, timer: null };
        if (wait > 0 && wait * 1000 <= MAX_TIMER_MS) {
          observer.timer = setTimeout(() => {
            this.observers.delete(observer);
            const now = this.newest(key);
            conn.send(`O ${key} ${now.token} ${now.holder}`);
          }, wait * 1000);
        }
        this.observers.add(observer);
        return;
      }
      default:
        conn.send(`E * ${key} unknown operation`);
    }
  }

  private acquire(conn: FakeConn, key: string, f: string[]): void {
    if (f.length < 4 || f.length > 5) {
      conn.send(`E A ${key} bad request`);
      return;
    }
    const lease = Number(f[2]);
    const wait = Number(f[3]);
    const shareText = f[4] ?? "1";
    const share: "x" | "r" | number = shareText === "1" ? "x" : shareText === "r" ? "r" : Number(shareText);
    let state = this.keys.get(key);
    if (!state) {
      state = { kind: typeof share === "number" ? share : "rw", grants: new Map(), queue: [] };
      this.keys.set(key, state);
    } else if ((state.kind === "rw") !== (typeof share !== "number") || (typeof share === "number" && share !== state.kind)) {
      conn.send(`E A ${key} the share does not match the key's kind`);
      return;
    }
    const waiter: Waiter = { conn, share, lease, timer: null };
    if (state.queue.length === 0 && this.fits(state, share)) {
      this.grant(key, state, waiter);
      return;
    }
    if (wait > 0 && wait * 1000 <= MAX_TIMER_MS) {
      waiter.timer = setTimeout(() => {
        const at = state!.queue.indexOf(waiter);
        if (at >= 0) state!.queue.splice(at, 1);
        conn.send(`T ${key}`);
        this.serve(key);
        this.cleanup(key);
      }, wait * 1000);
    }
    state.queue.push(waiter);
  }

  private fits(state: KeyState, share: "x" | "r" | number): boolean {
    if (typeof state.kind === "number") return state.grants.size < state.kind;
    if (share === "x") return state.grants.size === 0;
    for (const g of state.grants.values()) if (g.share === "x") return false;
    return true;
  }

  private grant(key: string, state: KeyState, waiter: Waiter): void {
    const token = this.nextToken++;
    state.grants.set(token, {
      token,
      holder: waiter.conn.name ?? "-",
      share: waiter.share,
      timer: this.leaseTimer(key, token, waiter.lease),
    });
    waiter.conn.send(`A ${key} ${token}`);
    this.notify(key);
  }

  private leaseTimer(key: string, token: bigint, lease: number): NodeJS.Timeout | null {
    // (A lease longer than a timer holds never runs out here.)
    if (!this.expire || lease * 1000 > MAX_TIMER_MS) return null;
    return setTimeout(() => {
      const state = this.keys.get(key);
      const grant = state?.grants.get(token);
      if (!state || !grant) return;
      const before = this.newest(key).token;
      state.grants.delete(token);
      this.serve(key);
      if (this.newest(key).token !== before) this.notify(key);
      this.cleanup(key);
    }, lease * 1000);
  }

  private serve(key: string): void {
    const state = this.keys.get(key);
    if (!state) return;
    while (state.queue.length > 0) {
      const head = state.queue[0]!;
      if (head.conn.closed) {
        state.queue.shift();
        continue;
      }
      if (!this.fits(state, head.share)) break;
      state.queue.shift();
      if (head.timer) clearTimeout(head.timer);
      this.grant(key, state, head);
    }
  }

  private cleanup(key: string): void {
    const state = this.keys.get(key);
    if (state && state.grants.size === 0 && state.queue.length === 0) this.keys.delete(key);
  }

  private notify(key: string): void {
    const newest = this.newest(key);
    for (const o of [...this.observers]) {
      if (o.key !== key || o.token === newest.token.toString()) continue;
      this.observers.delete(o);
      if (o.timer) clearTimeout(o.timer);
      o.conn.send(`O ${key} ${newest.token} ${newest.holder}`);
    }
  }

  dropConnection(conn: FakeConn): void {
    for (const [key, state] of this.keys) {
      const before = state.queue.length;
      state.queue = state.queue.filter((w) => {
        if (w.conn !== conn) return true;
        if (w.timer) clearTimeout(w.timer);
        return false;
      });
      if (state.queue.length !== before) {
        this.serve(key);
        this.cleanup(key);
      }
    }
    for (const o of [...this.observers]) {
      if (o.conn === conn) {
        if (o.timer) clearTimeout(o.timer);
        this.observers.delete(o);
      }
    }
  }
}
