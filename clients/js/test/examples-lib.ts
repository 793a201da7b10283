/**
 * The README's examples and what each prints.
 */

import { execFile } from "node:child_process";
import * as path from "node:path";

import { ROOT } from "./helpers.js";

export const EXPECT: Record<string, RegExp[]> = {
  lock: [/^holding orders\/42 with token [0-9]+$/m],
  using: [/^generating the report under token [0-9]+$/m],
  keepalive: [/^work done$/m],
  cancel: [/^gave up: cancelled$/m],
  shared: [],
  observe: [/^free$/m, /^held by worker-1 \(token [0-9]+\)$/m, /token: '0'/],
  elect: [/^leading with token [0-9]+$/m, /^the leader is 10\.0\.0\.5:8080$/m],
  errors: [/^busy: try later$/m, /^invalid$/m],
  tls: [],
};

export function runExample(name: string, env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [path.join(ROOT, "dist-examples", `${name}.js`)],
      { env: { ...process.env, ...env }, timeout: 20_000 },
      (error, stdout, stderr) => resolve({ code: error ? (typeof error.code === "number" ? error.code : -1) : 0, stdout, stderr }),
    );
  });
}

