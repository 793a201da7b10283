/**
 * One connection to a node: the line protocol of the client port,
 * pipelined. Requests are written at once; answers are paired with requests
 * by the echoed (op, key), in send order for equal pairs.
 */

import * as net from "node:net";
import * as tls from "node:tls";

import { ConnectionDropped } from "./errors.js";
import { pairOf, type Address } from "./wire.js";

/** A connection must answer its `I <name>` within this, or the attempt failed. */
export const READY_TIMEOUT_MS = 5000;
/** A connection suspected of stalling must answer a `P` within this, or it is cut. */
export const PROBE_TIMEOUT_MS = 3000;
/** A connection left for a redirect's target is closed after this, answered or not. */
export const RETIRE_TIMEOUT_MS = 5000;
/** Answers longer than this without a newline: the peer is not a lockservice node. */
const MAX_BUFFERED = 1 << 20;

interface Request {
  pair: string;
  seq: number;
  resolve: (fields: string[]) => void;
  reject: (error: Error) => void;
}

export const monotonic = (): number => performance.now();

let probeCounter = 0;

export class Connection {
  readonly address: Address;
  readonly name: string;
  readonly socket: net.Socket;
  /** Resolves when the node answered our `I <name>`; rejects when the attempt failed. */
  readonly ready: Promise<void>;
  isReady = false;
  closed = false;
  closeReason = "";
  /** When it became ready (monotonic ms), 0 until then. */
  readyAt = 0;
  /** When it closed (monotonic ms), 0 while open. */
  closedAt = 0;
  /** Called once when the connection closes (after it was ready or not). */
  onClose: ((conn: Connection) => void) | null = null;
  /** Keys with an outstanding `A` / `O` on this connection (at most one each). */
  readonly outstandingA = new Set<string>();
  readonly outstandingO = new Set<string>();
  /** Closing once the pending answers are in (a redirect moved this slot away). */
  retiring = false;

  private readonly pending = new Map<string, Request[]>();
  private pendingCount = 0;
  private seq = 0;
  private buffer = "";
  private probing = false;
  private readyTimer: NodeJS.Timeout | null = null;
  private readonly isTLS: boolean;

  constructor(address: Address, name: string, tlsOptions: tls.ConnectionOptions | null) {
    this.address = address;
    this.name = name;
    this.isTLS = tlsOptions !== null;
    let resolveReady!: () => void;
    let rejectReady!: (e: Error) => void;
    this.ready = new Promise<void>((res, rej) => {
      resolveReady = res;
      rejectReady = rej;
    });
    // Nobody may be listening when the attempt fails: the slot watches it.
    this.ready.catch(() => {});
    if (tlsOptions !== null) {
      const options: tls.ConnectionOptions = { ...tlsOptions, host: address.host, port: address.port };
      // The certificate is checked against the host of the address (an IP
      // address against an IP SAN); SNI only for names, never for an IP.
      if (options.servername === undefined && net.isIP(address.host) === 0) options.servername = address.host;
      this.socket = tls.connect(options);
    } else {
      this.socket = net.connect({ host: address.host, port: address.port });
    }
    this.socket.setNoDelay(true);
    this.socket.setEncoding("utf8");
    const onOpen = (): void => {
      this.request("I", name, `I ${name}\n`).then(
        () => {
          if (this.closed) return;
          this.isReady = true;
          this.readyAt = monotonic();
          if (this.readyTimer) clearTimeout(this.readyTimer);
          this.readyTimer = null;
          resolveReady();
        },
        () => {},
      );
    };
    if (tlsOptions !== null) this.socket.once("secureConnect", onOpen);
    else this.socket.once("connect", onOpen);
    this.readyTimer = setTimeout(() => {
      this.readyTimer = null;
      if (!this.isReady) this.destroy(`no answer within ${READY_TIMEOUT_MS / 1000} s of connecting`);
    }, READY_TIMEOUT_MS);
    this.socket.on("data", (chunk: string) => this.onData(chunk));
    this.socket.on("error", (err: Error) => {
      if (!this.closeReason) this.closeReason = describe(err);
    });
    this.socket.on("end", () => {
      // The node closed its side; ours goes too (answers already read).
      if (!this.closeReason) this.closeReason = "closed by the node";
      this.socket.destroy();
    });
    this.socket.on("close", () => {
      this.closed = true;
      this.closedAt = monotonic();
      if (this.readyTimer) clearTimeout(this.readyTimer);
      this.readyTimer = null;
      if (!this.closeReason) this.closeReason = "connection closed";
      if (!this.isReady) rejectReady(new Error(`${address.text}: ${this.closeReason}`));
      const pending = [...this.pending.values()];
      this.pending.clear();
      this.pendingCount = 0;
      this.outstandingA.clear();
      this.outstandingO.clear();
      const onClose = this.onClose;
      this.onClose = null;
      // Tell the slot first: a request failed below and re-sent at once must
      // not pick this connection again.
      if (onClose) onClose(this);
      const error = new ConnectionDropped(`${address.text}: ${this.closeReason}`);
      for (const queue of pending) for (const r of queue) r.reject(error);
    });
  }

  get tls(): boolean {
    return this.isTLS;
  }

  /** Requests sent whose answer has not come. */
  get inFlight(): number {
    return this.pendingCount;
  }

  /**
   * Sends `line` (the request `op key ...`); resolves with the answer's
   * fields, or rejects with {@link ConnectionDropped}.
   */
  request(op: string, key: string, line: string): Promise<string[]> {
    return new Promise<string[]>((resolve, reject) => {
      if (this.closed) {
        reject(new ConnectionDropped(`${this.address.text}: ${this.closeReason || "connection closed"}`));
        return;
      }
      const pair = `${op} ${key}`;
      const request: Request = { pair, seq: this.seq++, resolve, reject };
      const queue = this.pending.get(pair);
      if (queue) queue.push(request);
      else this.pending.set(pair, [request]);
      this.pendingCount++;
      this.socket.write(line);
    });
  }

  /** Writes a line that expects no answer we wait for (none today). */
  write(line: string): void {
    if (!this.closed) this.socket.write(line);
  }

  /**
   * A request on this connection got no answer within its bound: ask the
   * node for a `P`; if that is not answered within {@link PROBE_TIMEOUT_MS},
   * the node is stalled and the connection is cut (its requests fail as
   * dropped and the slot redials).
   */
  suspect(): void {
    if (this.probing || this.closed) return;
    this.probing = true;
    const word = `lockservice-probe-${++probeCounter}`;
    const timer = setTimeout(() => {
      this.destroy(`no answer to a ping within ${PROBE_TIMEOUT_MS / 1000} s (node stalled?)`);
    }, PROBE_TIMEOUT_MS);
    this.request("P", word, `P ${word}\n`).then(
      () => {
        clearTimeout(timer);
        this.probing = false;
      },
      () => clearTimeout(timer),
    );
  }

  /**
   * Close once every pending answer is in (at once when none is pending),
   * or after {@link RETIRE_TIMEOUT_MS} at the latest.
   */
  retire(): void {
    if (this.retiring) return;
    this.retiring = true;
    if (this.pendingCount === 0) this.end();
    else setTimeout(() => this.end(), RETIRE_TIMEOUT_MS).unref();
  }

  /** Closes our sending side; the node then closes its own. */
  end(): void {
    if (this.closed) return;
    this.socket.end();
    // A node that never closes its side does not keep this socket forever.
    setTimeout(() => this.destroy("closed"), 2000).unref();
  }

  destroy(reason: string): void {
    if (this.closed) return;
    if (!this.closeReason) this.closeReason = reason;
    this.socket.destroy();
  }

  private onData(chunk: string): void {
    let data = this.buffer + chunk;
    let start = 0;
    for (;;) {
      const nl = data.indexOf("\n", start);
      if (nl < 0) break;
      let line = data.slice(start, nl);
      start = nl + 1;
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line.length > 0) this.onLine(line);
      if (this.closed) return;
    }
    data = data.slice(start);
    if (data.length > MAX_BUFFERED) {
      this.destroy("an answer line too long (not a lockservice node?)");
      return;
    }
    this.buffer = data;
  }

  private onLine(line: string): void {
    const fields = line.split(" ");
    let pair = pairOf(fields);
    if (pair === null) return;
    let queue = this.pending.get(pair);
    if ((!queue || queue.length === 0) && fields[0] === "E") {
      // An error we cannot pair exactly (its op or key could not be read,
      // `*`): it belongs to one of our requests of that key, most likely
      // a C or an O that a server without them did not know, else the
      // oldest request of that op, else the oldest of all.
      const found = this.unpairedError(fields[1] ?? "*", fields[2] ?? "*");
      if (found !== null) {
        pair = found;
        queue = this.pending.get(found);
      }
    }
    if (!queue || queue.length === 0) return;
    const request = queue.shift()!;
    if (queue.length === 0) this.pending.delete(pair);
    this.pendingCount--;
    request.resolve(fields);
    if (this.retiring && this.pendingCount === 0) this.end();
  }

  private unpairedError(op: string, key: string): string | null {
    let best: Request | null = null;
    let bestRank = Infinity;
    for (const [pair, queue] of this.pending) {
      if (queue.length === 0) continue;
      const space = pair.indexOf(" ");
      const pOp = pair.slice(0, space);
      const pKey = pair.slice(space + 1);
      if (op !== "*" && pOp !== op) continue;
      if (key !== "*" && pKey !== key) continue;
      // Prefer what answers at once: a C or an O; a waiting A last.
      const rank = (pOp === "C" ? 0 : pOp === "O" ? 1 : pOp === "A" ? 3 : 2) * 1e12 + queue[0]!.seq;
      if (rank < bestRank) {
        bestRank = rank;
        best = queue[0]!;
      }
    }
    return best === null ? null : best.pair;
  }
}

/** One readable line for a socket error. */
export function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code && !error.message.includes(code)) return `${code}: ${error.message}`;
    return error.message || error.name;
  }
  return String(error);
}
