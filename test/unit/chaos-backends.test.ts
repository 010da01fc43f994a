/**
 * The chaos harness finds a WAL relay's PostgreSQL backends by the relay process's sockets
 * (chaos/backends.ts): the local ports of its connections to the server's port, from /proc.
 */
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { socketPortsOf } from '../../chaos/backends.js';

describe.runIf(process.platform === 'linux')('socketPortsOf', () => {
  it("gives the local ports of a process's connections to one remote port, and no other", async () => {
    const server = net.createServer((s) => s.on('error', () => undefined));
    const other = net.createServer((s) => s.on('error', () => undefined));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    await new Promise<void>((r) => other.listen(0, '127.0.0.1', r));
    const port = (server.address() as net.AddressInfo).port;
    const otherPort = (other.address() as net.AddressInfo).port;
    const connect = (to: number) =>
      new Promise<net.Socket>((resolve) => {
        const s = net.connect(to, '127.0.0.1', () => resolve(s));
      });
    const sockets = [await connect(port), await connect(port), await connect(otherPort)];
    try {
      expect(socketPortsOf(process.pid, port).sort()).toEqual([sockets[0]!.localPort, sockets[1]!.localPort].sort());
      expect(socketPortsOf(process.pid, otherPort)).toEqual([sockets[2]!.localPort]);
      expect(socketPortsOf(2 ** 22 + 7, port)).toEqual([]); // no such process
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
      await new Promise((r) => other.close(r));
    }
  });
});
