import t from 'tap';
import { acceptServiceUrl } from '../../src/gateway/replica-url.js';

const backend = 'http://old-lb:8083';
const configured = [backend, 'http://old-2:8083', 'http://old-3:9000/exec'];

t.test('a service URL naming a configured backend maps to that backend', async (t) => {
  t.equal(acceptServiceUrl('http://old-lb:8083', backend, configured), backend);
  t.equal(acceptServiceUrl('http://old-lb:8083/', backend, configured), backend);
  t.equal(acceptServiceUrl('http://old-2:8083', backend, configured), 'http://old-2:8083');
  t.equal(acceptServiceUrl('http://old-3:9000/exec', backend, configured), 'http://old-3:9000/exec');
});

t.test('what tokenResponseSendServerIP produces (an IP literal and a port) is a replica of the issuing backend', async (t) => {
  t.equal(acceptServiceUrl('http://10.42.0.17:8083', backend, configured), 'http://10.42.0.17:8083');
  t.equal(acceptServiceUrl('http://127.0.0.1:41234', backend, configured), 'http://127.0.0.1:41234');
  t.equal(acceptServiceUrl('http://[fd00::17]:8083', backend, configured), 'http://[fd00::17]:8083');
  t.equal(acceptServiceUrl('https://192.168.1.5:8443/', backend, configured), 'https://192.168.1.5:8443');
});

t.test('anything else is refused', async (t) => {
  const refused = [
    'http://169.254.169.254', // cloud metadata
    'http://169.254.169.254:80',
    'http://[fe80::1]:8083',
    'http://[::ffff:169.254.169.254]:80',
    'http://0.0.0.0:8083',
    'http://[::]:8083',
    'http://224.0.0.1:8083',
    'http://255.255.255.255:8083',
    'http://evil.example:8083', // a host name that is not a backend
    'http://old-lb.evil:8083',
    'http://10.0.0.1:8083/job/x', // a path
    'http://10.0.0.1:8083?x=1',
    'http://10.0.0.1:8083#x',
    'http://user:pw@10.0.0.1:8083',
    'http://user@old-lb:8083',
    'ftp://10.0.0.1:21',
    'file:///etc/passwd',
    'not a url',
    'http://old-3:9000', // a configured backend's host, but not the configured URL (it has a path)
  ];
  for (const u of refused) t.equal(acceptServiceUrl(u, backend, configured), null, u);
});
