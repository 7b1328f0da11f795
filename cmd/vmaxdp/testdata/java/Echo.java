import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.NetworkInterface;
import java.net.StandardSocketOptions;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketAddress;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.channels.DatagramChannel;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;

/**
 * Echo: an echo server written as Java programs usually are, for
 * TestRunJava.
 *
 *   java Echo udp|tcp ADDR PORT SECONDS
 *   java Echo mcast GROUP PORT SECONDS INTERFACE COUNT
 *
 * udp: a non-blocking DatagramChannel under a Selector (NIO). tcp: a
 * java.net.ServerSocket and a thread a connection. Both open their sockets
 * with Java's defaults: AF_INET6 carrying IPv4 as well, unless the JVM runs
 * with -Djava.net.preferIPv4Stack=true. It prints "ready" once it serves,
 * and exits after SECONDS. mcast: a DatagramChannel bound to PORT that
 * joins GROUP on INTERFACE at once (a market data receiver's way), prints
 * "ready", and once COUNT datagrams came, or SECONDS passed, "received N".
 */
public class Echo {
    public static void main(String[] a) throws Exception {
        InetSocketAddress local = new InetSocketAddress(a[1], Integer.parseInt(a[2]));
        long end = System.currentTimeMillis() + Long.parseLong(a[3]) * 1000;
        if (a[0].equals("udp")) {
            udp(local, end);
        } else if (a[0].equals("mcast")) {
            mcast(local, a[4], Integer.parseInt(a[5]), end);
        } else {
            tcp(local, end);
        }
        System.exit(0);
    }

    static void mcast(InetSocketAddress group, String ifname, int count, long end) throws IOException {
        NetworkInterface ni = NetworkInterface.getByName(ifname);
        DatagramChannel ch = DatagramChannel.open();
        ch.setOption(StandardSocketOptions.SO_REUSEADDR, true);
        ch.bind(new InetSocketAddress(group.getPort()));
        ch.join(group.getAddress(), ni);
        ch.configureBlocking(false);
        Selector sel = Selector.open();
        ch.register(sel, SelectionKey.OP_READ);
        ready();
        ByteBuffer b = ByteBuffer.allocateDirect(65536);
        int n = 0;
        while (n < count && System.currentTimeMillis() < end) {
            if (sel.select(100) == 0) {
                continue;
            }
            sel.selectedKeys().clear();
            while (ch.receive(b) != null) {
                n++;
                b.clear();
            }
        }
        System.out.println("received " + n);
        System.out.flush();
    }

    static void udp(InetSocketAddress local, long end) throws IOException {
        DatagramChannel ch = DatagramChannel.open();
        ch.bind(local);
        ch.configureBlocking(false);
        Selector sel = Selector.open();
        ch.register(sel, SelectionKey.OP_READ);
        ready();
        ByteBuffer b = ByteBuffer.allocateDirect(65536);
        while (System.currentTimeMillis() < end) {
            if (sel.select(100) == 0) {
                continue;
            }
            sel.selectedKeys().clear();
            SocketAddress from;
            while ((from = ch.receive(b)) != null) {
                b.flip();
                ch.send(b, from);
                b.clear();
            }
        }
    }

    static void tcp(InetSocketAddress local, long end) throws IOException {
        ServerSocket ss = new ServerSocket();
        ss.bind(local, 128);
        ss.setSoTimeout(100);
        ready();
        while (System.currentTimeMillis() < end) {
            Socket s;
            try {
                s = ss.accept();
            } catch (SocketTimeoutException e) {
                continue;
            }
            new Thread(() -> {
                try (s; InputStream in = s.getInputStream(); OutputStream out = s.getOutputStream()) {
                    byte[] b = new byte[65536];
                    int n;
                    while ((n = in.read(b)) > 0) {
                        out.write(b, 0, n);
                    }
                } catch (IOException e) {
                    System.out.println("connection: " + e);
                }
            }).start();
        }
    }

    static void ready() {
        System.out.println("ready");
        System.out.flush();
    }
}
