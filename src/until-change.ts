import type { EventEmitter } from 'node:events';

/** Resolves once `predicate()` holds: checked now and after every 'change' event of `emitter`. */
export async function untilChange(emitter: EventEmitter, predicate: () => boolean): Promise<void> {
  if (predicate()) return;
  await new Promise<void>((resolve) => {
    const check = (): void => {
      if (!predicate()) return;
      emitter.off('change', check);
      resolve();
    };
    emitter.on('change', check);
  });
}
