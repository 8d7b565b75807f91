/// <reference types="node" />
/**
 * Node-only pieces of the client (`@narad/client/node`), kept out of the
 * main entry so that it stays free of Node modules for browsers and workers.
 */
import { open, readFile } from "node:fs/promises";
import { dirname } from "node:path";

import type { TokenEntry, TokenStore } from "./executor.js";

/**
 * An executor's durable token store in Node: an append-only file of JSON
 * lines, each write synced to disk before `put` resolves (so a token is
 * recorded as accepted before its tool runs, and survives a crash). The
 * first write of a store also syncs its directory, so that a file the write
 * created is still there after a crash. The last line of a token wins; a
 * line torn by a crash mid-write is skipped.
 */
export class FileTokenStore implements TokenStore {
  private directorySynced = false;

  constructor(private readonly path: string) {}

  async get(executionToken: string): Promise<TokenEntry | undefined> {
    return (await this.read()).get(executionToken);
  }

  async put(entry: TokenEntry): Promise<void> {
    const file = await open(this.path, "a");
    try {
      // Led by a newline: a line torn by a crash can never swallow this one.
      await file.write(`\n${JSON.stringify(entry)}\n`);
      await file.datasync();
    } finally {
      await file.close();
    }
    if (!this.directorySynced) {
      await syncDirectory(dirname(this.path));
      this.directorySynced = true;
    }
  }

  async all(): Promise<TokenEntry[]> {
    return [...(await this.read()).values()];
  }

  private async read(): Promise<Map<string, TokenEntry>> {
    let text: string;
    try {
      text = await readFile(this.path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") {
        return new Map();
      }
      throw e;
    }
    const entries = new Map<string, TokenEntry>();
    for (const line of text.split("\n")) {
      if (!line) {
        continue;
      }
      try {
        const entry = JSON.parse(line) as TokenEntry;
        entries.set(entry.executionToken, entry);
      } catch {
        // A line torn by a crash mid-write: its put never resolved.
      }
    }
    return entries;
  }
}

/** Syncs a directory's entries to disk, where the platform can (not on Windows). */
async function syncDirectory(path: string): Promise<void> {
  let directory;
  try {
    directory = await open(path, "r");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "EISDIR" || code === "EPERM" || code === "EACCES") return;
    throw e;
  }
  try {
    await directory.sync();
  } finally {
    await directory.close();
  }
}
