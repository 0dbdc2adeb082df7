import t from 'tap';
import * as slotgate from '../src/index.js';

t.test('the public surface names what a fylr integration and an operator need', async (t) => {
  for (const name of ['decode', 'encode', 'validateJob', 'createExecserver', 'createGateway', 'ExecClient', 'PipeServer', 'startFylr', 'WantBook', 'ManualClock', 'loadServeConfig', 'migrateFileQueue', 'ERRORS']) {
    t.ok(name in slotgate, `exports ${name}`);
  }
  const frame = slotgate.encode({ type: 'WANT', job_id: 'j', service: 's', priority: 1 });
  t.same(slotgate.decodeFromFylr(frame), { type: 'WANT', job_id: 'j', service: 's', priority: 1 });
});
