/**
 * The ids an agent runtime derives for a run's steps and events: made of
 * the run id and a step number, so that a later holder of the run derives
 * the same ones (the same scheme as the Python SDK's `narad.runtime`, so a
 * Python runtime and a TypeScript one can take over each other's runs).
 */

/** The longest id the protocol allows, in characters (`defs.id`). */
export const MAX_ID_LENGTH = 256;

/** The UUID namespace of ids hashed for length (the Python SDK's `_ID_NAMESPACE`). */
const ID_NAMESPACE = "5f3c4c1e-3a52-4f0e-9d8e-6e6172616401";

/**
 * An id made of `parts` joined with dots (`run-1.3.tool`); when that is
 * over 256 characters, a UUIDv5 of it followed by the last part (at most 64
 * characters), so it stays unique, readable and within the limit.
 */
export function ident(...parts: (string | number)[]): string {
  const text = parts.map(String).join(".");
  const chars = Array.from(text);
  if (chars.length <= MAX_ID_LENGTH) {
    return text;
  }
  const last = Array.from(String(parts[parts.length - 1] ?? "")).slice(0, 64).join("");
  return `${uuidV5(ID_NAMESPACE, text)}.${last}`;
}

/** The UUID version 5 (RFC 9562, SHA-1) of `name` in namespace `namespace`. */
export function uuidV5(namespace: string, name: string): string {
  const ns = namespace.replace(/-/g, "");
  const bytes = new Uint8Array(16);
  for (let i = 0; i < 16; i++) {
    bytes[i] = parseInt(ns.slice(i * 2, i * 2 + 2), 16);
  }
  const encoded = new TextEncoder().encode(name);
  const input = new Uint8Array(16 + encoded.length);
  input.set(bytes, 0);
  input.set(encoded, 16);
  const hash = sha1(input);
  hash[6] = ((hash[6] as number) & 0x0f) | 0x50;
  hash[8] = ((hash[8] as number) & 0x3f) | 0x80;
  const hex = Array.from(hash.subarray(0, 16), (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}

/** SHA-1 of `data` (FIPS 180-4): synchronous, for ids only (never for security). */
export function sha1(data: Uint8Array): Uint8Array {
  const length = data.length;
  const padded = new Uint8Array((((length + 8) >> 6) + 1) << 6);
  padded.set(data);
  padded[length] = 0x80;
  const view = new DataView(padded.buffer);
  const bits = length * 8;
  view.setUint32(padded.length - 8, Math.floor(bits / 2 ** 32));
  view.setUint32(padded.length - 4, bits >>> 0);
  let h0 = 0x67452301;
  let h1 = 0xefcdab89;
  let h2 = 0x98badcfe;
  let h3 = 0x10325476;
  let h4 = 0xc3d2e1f0;
  const w = new Uint32Array(80);
  for (let offset = 0; offset < padded.length; offset += 64) {
    for (let i = 0; i < 16; i++) {
      w[i] = view.getUint32(offset + i * 4);
    }
    for (let i = 16; i < 80; i++) {
      const x = (w[i - 3] as number) ^ (w[i - 8] as number) ^ (w[i - 14] as number) ^ (w[i - 16] as number);
      w[i] = (x << 1) | (x >>> 31);
    }
    let a = h0;
    let b = h1;
    let c = h2;
    let d = h3;
    let e = h4;
    for (let i = 0; i < 80; i++) {
      let f: number;
      let k: number;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5a827999;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ed9eba1;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8f1bbcdc;
      } else {
        f = b ^ c ^ d;
        k = 0xca62c1d6;
      }
      const t = (((a << 5) | (a >>> 27)) + f + e + k + (w[i] as number)) >>> 0;
      e = d;
      d = c;
      c = (b << 30) | (b >>> 2);
      b = a;
      a = t;
    }
    h0 = (h0 + a) >>> 0;
    h1 = (h1 + b) >>> 0;
    h2 = (h2 + c) >>> 0;
    h3 = (h3 + d) >>> 0;
    h4 = (h4 + e) >>> 0;
  }
  const out = new Uint8Array(20);
  const result = new DataView(out.buffer);
  [h0, h1, h2, h3, h4].forEach((h, i) => result.setUint32(i * 4, h));
  return out;
}
