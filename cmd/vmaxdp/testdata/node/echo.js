// echo: servers and a client written as Node.js programs usually are
// (libuv's event loop), for TestRunNode.
//
//   node echo.js udp4|udp6|tcp ADDR PORT SECONDS
//   node echo.js cluster ADDR PORT SECONDS WORKERS
//   node echo.js client ADDR PORT COUNT
//
// udp4, udp6: a dgram socket that echoes each datagram (udp6 with
// ipv6Only off carries IPv4 as well). tcp: a net server that pipes each
// connection back to itself. cluster: WORKERS cluster workers that share
// one udp4 socket, which the primary binds and passes to each (the
// cluster module's way). Each prints "ready" once it serves, and exits
// after SECONDS. client: sends COUNT datagrams to ADDR:PORT, one after
// the other, each to be echoed within 2 s, and prints "echoed COUNT", or
// where it stopped.
'use strict';
const cluster = require('cluster');
const dgram = require('dgram');
const net = require('net');

const [kind, addr, portArg, arg, workers] = process.argv.slice(2);
const port = Number(portArg);

function server(type) {
  const s = dgram.createSocket({type: type, ipv6Only: false});
  s.on('message', (msg, rinfo) => s.send(msg, rinfo.port, rinfo.address));
  s.bind(port, addr, () => console.log('ready'));
}

function client(count) {
  const s = dgram.createSocket('udp4');
  let i = 0;
  let timer = null;
  const next = () => {
    if (i === count) {
      console.log('echoed ' + count);
      process.exit(0);
    }
    s.send('datagram ' + i + ';', port, addr);
    clearTimeout(timer);
    timer = setTimeout(() => {
      console.log('echoed ' + i + ', then none in 2 s');
      process.exit(1);
    }, 2000);
  };
  s.on('message', (msg) => {
    if (msg.toString() !== 'datagram ' + i + ';') {
      console.log('datagram ' + i + ': echo ' + JSON.stringify(msg.toString()));
      process.exit(1);
    }
    i++;
    next();
  });
  next();
}

if (kind === 'client') {
  client(Number(arg));
} else {
  if (kind === 'cluster' && cluster.isPrimary) {
    for (let w = 0; w < Number(workers); w++) cluster.fork();
  } else if (kind === 'tcp') {
    net.createServer((c) => c.pipe(c)).listen(port, addr, () => console.log('ready'));
  } else {
    server(kind === 'udp6' ? 'udp6' : 'udp4');
  }
  setTimeout(() => process.exit(0), Number(arg) * 1000);
}
