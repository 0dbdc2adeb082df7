import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { createPool, databaseUrl } from '../../src/db/pool.js';
import { migrateFileQueue } from '../../src/db/file-queue-schema.js';

export interface TestSchema {
  url: string;
  schema: string;
  pool: pg.Pool;
  /** A further pool on the same schema (another "fylr server"). */
  newPool(max?: number): pg.Pool;
}

/**
 * A fresh schema with a migrated file_queue, dropped at the end of the test. Honours DATABASE_URL.
 */
export async function testSchema(t: { teardown(fn: () => unknown): void }, name = 't'): Promise<TestSchema> {
  const url = databaseUrl();
  const schema = `sg_${name.replace(/[^a-z0-9_]/gi, '_').toLowerCase().slice(0, 30)}_${randomBytes(4).toString('hex')}`;
  const admin = createPool(url, { max: 1 });
  await admin.query(`CREATE SCHEMA ${schema}`);
  const pools: pg.Pool[] = [];
  const newPool = (max = 5): pg.Pool => {
    const p = createPool(url, { schema, max });
    pools.push(p);
    return p;
  };
  const pool = newPool(10);
  await migrateFileQueue(pool);
  t.teardown(async () => {
    await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
    await admin.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => undefined);
    await admin.end();
  });
  return { url, schema, pool, newPool };
}
