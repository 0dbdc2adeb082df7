import t from 'tap';
import { legacyErrorText, parseLegacyAddress, translateLegacyError } from '../../src/protocol/legacy-wire.js';

t.test('legacy error bodies become typed errors, once', async (t) => {
  const code = (status: number, body: string) => translateLegacyError(status, body).code;
  t.equal(code(400, '{"Error": "Token not found", "Status": 400}'), 'token_not_found');
  t.equal(code(400, '{"Error":"Token not valid for service \\"a\\"","Status":400}'), 'token_not_found', "the old server's wrong-service answer");
  t.equal(code(503, '{"Error": "All workers busy", "Status": 503}'), 'all_workers_busy');
  t.equal(code(404, '{"Error": "Unknown service \\"x\\"", "Status": 404}'), 'unknown_service');
  t.equal(code(400, '{"Error": "Invalid job: job.commands must be an array", "Status": 400}'), 'invalid_job');
  t.equal(code(400, 'garbage'), 'bad_request');
  t.equal(code(500, '<html>oops</html>'), 'backend_failed');
  t.match(translateLegacyError(502, 'x', 'backend http://old:1').message, /^backend http:\/\/old:1 answered 502/);
  t.equal(legacyErrorText('{"Error": 3}'), null);
  t.equal(legacyErrorText('[]'), null);
});

t.test('a /job/<service> path limits a legacy address to that service', async (t) => {
  t.same(parseLegacyAddress('http://exec:8083'), { address: 'http://exec:8083', base: 'http://exec:8083', onlyService: null });
  t.same(parseLegacyAddress('http://exec:8083/job/a%20b').onlyService, 'a b');
});
