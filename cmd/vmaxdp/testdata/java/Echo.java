import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
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
 *
 * udp: a non-blocking DatagramChannel under a Selector (NIO). tcp: a
 * java.net.ServerSocket and a thread a connection. Both open their sockets
 * with Java's defaults: AF_INET6 carrying IPv4 as well, unless the JVM runs
 * with -Djava.net.preferIPv4Stack=true. It prints "ready" once it serves,
 * and exits after SECONDS.
 */
public class Echo {
    public static void main(String[] a) throws Exception {
        InetSocketAddress local = new InetSocketAddress(a[1], Integer.parseInt(a[2]));
        long end = System.currentTimeMillis() + Long.parseLong(a[3]) * 1000;
        if (a[0].equals("udp")) {
            udp(local, end);
        } else {
            tcp(local, end);
        }
        System.exit(0);
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
