/**
 * What token usage costs, from the operator's price table
 * (`NARAD_CONSOLE_PRICES`, read from `config.json` at start): per model,
 * each usage counter's price per million. A run's model is the
 * `input.model` of its `run.started`; a model without an entry takes the
 * `*` entry; one with neither, or a counter without a price, is left
 * unpriced and said so. No prices are built in.
 */

/** The price table as `config.json` gives it. */
export interface Prices {
  /** ISO 4217. */
  currency: string;
  /** Model (or `*`) → usage counter → price per million. */
  perMillion: Record<string, Record<string, number>>;
}

/** What some usage costs: the amount of what was priced, and what was not. */
export interface Cost {
  amount: number;
  currency: string;
  /** Models without an entry, and counters without a price (`model: counter`). */
  unpriced: string[];
}

let table: Prices | null = null;

/** Sets the price table (at start, from `config.json`); `null`: usage without cost. */
export function setPrices(prices: Prices | null): void {
  table = prices;
}

/** Whether the operator configured prices. */
export function hasPrices(): boolean {
  return table !== null;
}

/** A run's model: `input.model` of its `run.started`, when a string. */
export function modelOf(started: object | undefined): string | undefined {
  const input = (started as { input?: unknown } | undefined)?.input;
  if (typeof input !== "object" || input === null) return undefined;
  const model = (input as Record<string, unknown>)["model"];
  return typeof model === "string" && model !== "" ? model : undefined;
}

/**
 * What usage costs, given per model (`undefined`: runs that named none);
 * `undefined` without a price table.
 */
export function costOf(byModel: Iterable<[string | undefined, Record<string, number>]>): Cost | undefined {
  if (table === null) return undefined;
  let amount = 0;
  const unpriced = new Set<string>();
  for (const [model, usage] of byModel) {
    const prices = (model !== undefined ? table.perMillion[model] : undefined) ?? table.perMillion["*"];
    const name = model ?? "no model named";
    for (const [counter, count] of Object.entries(usage)) {
      if (count === 0) continue;
      const price = prices?.[counter];
      if (prices === undefined) unpriced.add(name);
      else if (price === undefined) unpriced.add(`${name}: ${counter}`);
      else amount += (count / 1_000_000) * price;
    }
  }
  return { amount, currency: table.currency, unpriced: [...unpriced].sort() };
}

/** An amount for a person: "$0.0042", "€12.30". */
export function money(amount: number, currency: string): string {
  const digits = amount !== 0 && Math.abs(amount) < 0.01 ? 4 : 2;
  return new Intl.NumberFormat("en", { style: "currency", currency, minimumFractionDigits: digits, maximumFractionDigits: digits }).format(amount);
}

/** A cost for a person, with what it leaves out: "$0.42 (not priced: m-3)". */
export function costText(cost: Cost): string {
  const left = cost.unpriced.length > 0 ? ` (not priced: ${cost.unpriced.join(", ")})` : "";
  return `${money(cost.amount, cost.currency)}${left}`;
}
