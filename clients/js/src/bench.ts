#!/usr/bin/env node
/**
 * A small bench: N lockers, each on its own key, doing acquire+release pairs
 * for S seconds against one cluster. Prints one JSON line: pairs per second
 * and this process's CPU seconds per pair (process.cpuUsage).
 *
 *     node dist/bench.js --addr HOST:PORT [--concurrency N] [--duration S] [--lease S] [--prefix P]
 */

import { randomBytes } from "node:crypto";

import { connect } from "./client.js";

function usage(message: string): never {
  process.stderr.write(`lockservice bench: ${message} (usage: bench --addr HOST:PORT[,HOST:PORT...] [--concurrency N] [--duration S] [--lease S] [--prefix P])\n`);
  process.exit(2);
}

function parse(argv: string[]): { addr: string; concurrency: number; duration: number; lease: number; prefix: string } {
  const values: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf("=");
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    if (!["--addr", "--addrs", "--concurrency", "--duration", "--lease", "--prefix"].includes(flag)) usage(`unknown argument ${JSON.stringify(arg)}`);
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) usage(`${flag} needs a value`);
    values[flag === "--addrs" ? "--addr" : flag] = value;
  }
  const addr = values["--addr"] ?? usage("--addr is required");
  const concurrency = Number(values["--concurrency"] ?? "1");
  const duration = Number(values["--duration"] ?? "5");
  const lease = Number(values["--lease"] ?? "30");
  if (!Number.isInteger(concurrency) || concurrency < 1) usage("--concurrency must be an integer >= 1");
  if (!(duration > 0)) usage("--duration must be > 0");
  if (!(lease > 0)) usage("--lease must be > 0");
  return { addr, concurrency, duration, lease, prefix: values["--prefix"] ?? `bench-${randomBytes(4).toString("hex")}` };
}

async function main(): Promise<void> {
  const args = parse(process.argv.slice(2));
  const client = connect(args.addr, { name: "bench" });
  await client.whenConnected(10);
  let pairs = 0;
  let errors = 0;
  let firstError: string | null = null;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const until = t0 + args.duration * 1000;
  await Promise.all(
    Array.from({ length: args.concurrency }, async (_, i) => {
      const key = `${args.prefix}/${i}`;
      while (performance.now() < until) {
        try {
          const lock = await client.acquire(key, { lease: args.lease, wait: 10 });
          await lock.release();
          pairs++;
        } catch (error) {
          errors++;
          firstError ??= (error as Error).message;
          if (errors > 100) return;
        }
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  await client.close();
  process.stdout.write(
    `${JSON.stringify({
      client: "js",
      concurrency: args.concurrency,
      duration_s: Number(elapsed.toFixed(3)),
      pairs,
      errors,
      pairs_per_s: Number((pairs / elapsed).toFixed(1)),
      cpu_s_per_pair: pairs > 0 ? Number((cpuSeconds / pairs).toExponential(3)) : null,
      cpu_user_s: cpu.user / 1e6,
      cpu_system_s: cpu.system / 1e6,
      ...(firstError ? { first_error: firstError } : {}),
    })}\n`,
  );
  process.exit(errors > 0 && pairs === 0 ? 1 : 0);
}

main().catch((error: unknown) => {
  process.stderr.write(`lockservice bench: ${(error as Error).message}\n`);
  process.exit(1);
});
