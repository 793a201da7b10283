/**
 * lockservice: the official TypeScript (Node) client.
 */

export {
  Client,
  VERSION,
  campaignValueProblem,
  connect,
  type AcquireOptions,
  type CampaignOptions,
  type ConnectOptions,
  type HolderState,
  type ObserveResult,
} from "./client.js";
export {
  CancelledError,
  InvalidError,
  LockLostError,
  LockServiceError,
  NoConnectionError,
  RejectedError,
  StaleError,
  TimeoutError,
  type ErrorCode,
} from "./errors.js";
export { Leadership, Lock } from "./lock.js";
export { formatSeconds, keyProblem, valueOfName, type Share } from "./wire.js";
