/**
 * The raw JSON text of each member of a top-level JSON object, so that a
 * number (an `id` beyond 2^53) is echoed exactly as written: `JSON.parse`
 * turns it into a float64 and loses digits.
 */

/** The members of the object `text` (valid JSON, checked by `JSON.parse` first) as their raw value texts; null when it is not an object. */
export function rawMembers(text: string): Map<string, string> | null {
  let i = 0;
  const n = text.length;
  const ws = (): void => {
    while (i < n && (text[i] === " " || text[i] === "\t" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  const skipString = (): void => {
    // text[i] is the opening quote.
    i++;
    while (i < n && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
  };
  const skipValue = (): void => {
    const c = text[i];
    if (c === '"') {
      skipString();
      return;
    }
    if (c === "{" || c === "[") {
      let depth = 0;
      while (i < n) {
        const d = text[i];
        if (d === '"') {
          skipString();
          continue;
        }
        if (d === "{" || d === "[") depth++;
        else if (d === "}" || d === "]") {
          depth--;
          if (depth === 0) {
            i++;
            return;
          }
        }
        i++;
      }
      return;
    }
    // A number or a literal: up to the next separator.
    while (i < n && !",}] \t\n\r".includes(text[i]!)) i++;
  };
  ws();
  if (text[i] !== "{") return null;
  i++;
  const members = new Map<string, string>();
  for (;;) {
    ws();
    if (i >= n || text[i] === "}") return members;
    if (text[i] === ",") {
      i++;
      continue;
    }
    if (text[i] !== '"') return null;
    const keyStart = i;
    skipString();
    // The name decoded as JSON.parse would (escapes included).
    const name = JSON.parse(text.slice(keyStart, i)) as string;
    ws();
    if (text[i] !== ":") return null;
    i++;
    ws();
    const valueStart = i;
    skipValue();
    // The last of duplicate names wins, as with JSON.parse.
    members.set(name, text.slice(valueStart, i));
  }
}
