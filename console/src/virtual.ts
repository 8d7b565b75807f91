/**
 * A Preact hook over `@tanstack/virtual-core`: only the entries in (and
 * near) view are in the page, each measured as drawn, so a conversation of
 * thousands of entries scrolls as lightly as one of ten.
 */
import {
  elementScroll,
  observeElementOffset,
  observeElementRect,
  type PartialKeys,
  Virtualizer,
  type VirtualizerOptions,
} from "@tanstack/virtual-core";
import { useLayoutEffect, useReducer, useState } from "preact/hooks";

/** The options a caller gives; the element observers and scrolling are the library's own. */
export type ListOptions = PartialKeys<
  VirtualizerOptions<HTMLElement, HTMLElement>,
  "observeElementRect" | "observeElementOffset" | "scrollToFn"
>;

/** A virtualizer of a scrolling element, re-rendering the component when its window moves. */
export function useVirtualizer(options: ListOptions): Virtualizer<HTMLElement, HTMLElement> {
  const [, rerender] = useReducer((n: number) => n + 1, 0);
  const resolved: VirtualizerOptions<HTMLElement, HTMLElement> = {
    observeElementRect,
    observeElementOffset,
    scrollToFn: elementScroll,
    ...options,
    onChange: (instance, sync) => {
      rerender(undefined);
      options.onChange?.(instance, sync);
    },
  };
  const [instance] = useState(() => new Virtualizer(resolved));
  instance.setOptions(resolved);
  useLayoutEffect(() => instance._didMount(), [instance]);
  useLayoutEffect(() => instance._willUpdate());
  return instance;
}
