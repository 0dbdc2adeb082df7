import { SlotgateError } from '../errors.js';

/** A bad configuration: `key` is the dotted path of the offending key. */
export class ConfigError extends SlotgateError {
  readonly key: string;

  constructor(key: string, problem: string) {
    super('config_invalid', `config: ${key}: ${problem}`);
    this.name = 'ConfigError';
    this.key = key;
  }
}
