/**
 * Test helpers: certificates (openssl), free ports, the driver as a child
 * process, real lockservice nodes (twistd).
 */

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import * as tls from "node:tls";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
/** clients/js (this file runs from clients/js/dist-test) */
export const ROOT = path.resolve(here, "..");
export const DRIVER = path.join(ROOT, "dist", "driver.js");

export function tmpdir(prefix = "lockservice-js-"): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
  });
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export interface Certs {
  dir: string;
  ca: string;
  /** The node's certificate, for 127.0.0.1, ::1 and localhost. */
  nodeCert: string;
  nodeKey: string;
  /** A certificate for another host only (other.example). */
  otherCert: string;
  otherKey: string;
  clientCert: string;
  clientKey: string;
  /** A client certificate from another CA. */
  strangerCert: string;
  strangerKey: string;
}

function openssl(args: string[], cwd: string): void {
  execFileSync("openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"] });
}

function makeCA(dir: string, name: string): void {
  openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", `${name}.key`], dir);
  openssl(
    ["req", "-x509", "-new", "-key", `${name}.key`, "-subj", `/CN=${name}`, "-days", "30", "-out", `${name}.pem`,
      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
    dir,
  );
}

function issue(dir: string, ca: string, name: string, ext: string): void {
  openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", `${name}.key`], dir);
  openssl(["req", "-new", "-key", `${name}.key`, "-subj", `/CN=${name}`, "-out", `${name}.csr`], dir);
  fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
  openssl(
    ["x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`, "-CAcreateserial", "-days", "30",
      "-out", `${name}.pem`, "-extfile", `${name}.ext`],
    dir,
  );
}

/** A throw-away CA and certificates, made with openssl. */
export function makeCerts(): Certs {
  const dir = tmpdir("lockservice-js-certs-");
  makeCA(dir, "ca");
  makeCA(dir, "otherca");
  issue(dir, "ca", "node", "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n");
  issue(dir, "ca", "other", "subjectAltName=DNS:other.example\nextendedKeyUsage=serverAuth,clientAuth\n");
  issue(dir, "ca", "client", "extendedKeyUsage=clientAuth\n");
  issue(dir, "otherca", "stranger", "extendedKeyUsage=clientAuth\n");
  const p = (f: string): string => path.join(dir, f);
  return {
    dir,
    ca: p("ca.pem"),
    nodeCert: p("node.pem"),
    nodeKey: p("node.key"),
    otherCert: p("other.pem"),
    otherKey: p("other.key"),
    clientCert: p("client.pem"),
    clientKey: p("client.key"),
    strangerCert: p("stranger.pem"),
    strangerKey: p("stranger.key"),
  };
}

/** The driver as a child process, speaking JSON lines. */
export class DriverProcess {
  readonly proc: ChildProcess;
  readonly out: Array<Record<string, unknown>> = [];
  readonly raw: string[] = [];
  stderr = "";
  exitCode: number | null = null;
  readonly exited: Promise<number | null>;
  private waiters = new Set<() => void>();

  constructor(args: string[]) {
    this.proc = spawn(process.execPath, [DRIVER, ...args], { stdio: ["pipe", "pipe", "pipe"] });
    let buffer = "";
    this.proc.stdout!.setEncoding("utf8");
    this.proc.stdout!.on("data", (chunk: string) => {
      buffer += chunk;
      let nl: number;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        this.raw.push(line);
        this.out.push(JSON.parse(line) as Record<string, unknown>);
        for (const w of [...this.waiters]) w();
      }
    });
    this.proc.stderr!.setEncoding("utf8");
    this.proc.stderr!.on("data", (chunk: string) => (this.stderr += chunk));
    this.proc.stdin!.on("error", () => {});
    this.exited = new Promise((resolve) => {
      this.proc.on("exit", (code) => {
        this.exitCode = code;
        for (const w of [...this.waiters]) w();
        resolve(code);
      });
    });
  }

  send(command: Record<string, unknown> | string): void {
    this.proc.stdin!.write(`${typeof command === "string" ? command : JSON.stringify(command)}\n`);
  }

  endInput(): void {
    this.proc.stdin!.end();
  }

  /** The first output line (from index `from` on) that `match` takes. */
  next(match: (o: Record<string, unknown>) => boolean, ms = 10_000, from = 0): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const check = (): boolean => {
        for (let i = from; i < this.out.length; i++) {
          if (match(this.out[i]!)) {
            finish();
            resolve(this.out[i]!);
            return true;
          }
        }
        if (this.exitCode !== null) {
          finish();
          reject(new Error(`driver exited (${this.exitCode}); output: ${this.raw.join(" | ")}; stderr: ${this.stderr}`));
          return true;
        }
        return false;
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`no matching driver output within ${ms} ms; output: ${this.raw.join(" | ")}; stderr: ${this.stderr.slice(-2000)}`));
      }, ms);
      const waiter = (): void => void check();
      const finish = (): void => {
        clearTimeout(timer);
        this.waiters.delete(waiter);
      };
      if (check()) return;
      this.waiters.add(waiter);
    });
  }

  /** The result of command `id`. */
  result(id: unknown, ms = 10_000): Promise<Record<string, unknown>> {
    return this.next((o) => o["id"] === id && !("event" in o), ms);
  }

  /** Index in `out` of the result of `id` (-1 if not there). */
  indexOf(id: unknown): number {
    return this.out.findIndex((o) => o["id"] === id && !("event" in o));
  }

  async kill(): Promise<void> {
    if (this.exitCode === null) {
      this.proc.kill("SIGKILL");
      await this.exited;
    }
  }
}

// -- real nodes --------------------------------------------------------------

export const TWISTD = process.env["LOCKSERVICE_TWISTD"] ?? "";

export interface NodeOptions {
  port: number;
  peers?: number[];
  secret?: string;
  tls?: { cert: string; key: string; ca?: string };
  extra?: string[];
}

/** A real lockservice node (a twistd process). */
export class RealNode {
  readonly port: number;
  readonly proc: ChildProcess;
  log = "";
  exited: Promise<void>;
  alive = true;

  constructor(readonly options: NodeOptions) {
    this.port = options.port;
    const args = ["-n", "--pidfile=", "lockservice", "--listen", `tcp:${options.port}:interface=127.0.0.1`];
    if (options.peers) {
      args.push("--peers", options.peers.map((p) => `127.0.0.1:${p}`).join(","), "--node", `127.0.0.1:${options.port}`, "--secret", options.secret!);
    }
    if (options.tls) {
      args.push("--tls-cert", options.tls.cert, "--tls-key", options.tls.key);
      if (options.tls.ca) args.push("--tls-ca", options.tls.ca);
    }
    args.push(...(options.extra ?? []));
    this.proc = spawn(TWISTD, args, { stdio: ["ignore", "pipe", "pipe"] });
    const keep = (chunk: Buffer): void => {
      this.log = (this.log + chunk.toString()).slice(-20_000);
    };
    this.proc.stdout!.on("data", keep);
    this.proc.stderr!.on("data", keep);
    this.exited = new Promise((resolve) => this.proc.on("exit", () => {
      this.alive = false;
      resolve();
    }));
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Waits until the node answers `P`. */
  async ready(ms = 20_000, tlsOptions?: tls.ConnectionOptions): Promise<void> {
    const until = performance.now() + ms;
    for (;;) {
      if (!this.alive) throw new Error(`node ${this.port} exited: ${this.log}`);
      if (await pingOnce(this.port, tlsOptions)) return;
      if (performance.now() > until) throw new Error(`node ${this.port} not answering P: ${this.log}`);
      await sleep(100);
    }
  }

  async stop(signal: NodeJS.Signals = "SIGTERM", ms = 15_000): Promise<void> {
    if (!this.alive) return;
    this.proc.kill(signal);
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), ms);
    await this.exited;
    clearTimeout(timer);
  }
}

/** One raw exchange with a node: sends `lines`, collects what comes back for `ms`. */
export function exchange(port: number, lines: string[], ms = 500, tlsOptions?: tls.ConnectionOptions): Promise<string[]> {
  return new Promise((resolve) => {
    const socket = tlsOptions ? tls.connect({ ...tlsOptions, host: "127.0.0.1", port }) : net.connect({ host: "127.0.0.1", port });
    let data = "";
    socket.setEncoding("utf8");
    socket.on(tlsOptions ? "secureConnect" : "connect", () => socket.write(lines.map((l) => `${l}\n`).join("")));
    socket.on("data", (chunk: string) => (data += chunk));
    socket.on("error", () => {});
    const timer = setTimeout(() => socket.destroy(), ms);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(data.split("\n").filter((l) => l.length > 0));
    });
  });
}

function pingOnce(port: number, tlsOptions?: tls.ConnectionOptions): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tlsOptions ? tls.connect({ ...tlsOptions, host: "127.0.0.1", port }) : net.connect({ host: "127.0.0.1", port });
    let data = "";
    const done = (ok: boolean): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), 1000);
    socket.setEncoding("utf8");
    socket.on(tlsOptions ? "secureConnect" : "connect", () => socket.write("P x\n"));
    socket.on("data", (chunk: string) => {
      data += chunk;
      if (data.includes("P x\n")) done(true);
    });
    socket.on("error", () => done(false));
    socket.on("close", () => done(data.includes("P x\n")));
  });
}

/** A secret file for a cluster. */
export function secretFile(dir: string): string {
  const file = path.join(dir, "secret");
  fs.writeFileSync(file, Buffer.from(Array.from({ length: 32 }, () => Math.floor(Math.random() * 256))).toString("hex"));
  return file;
}
