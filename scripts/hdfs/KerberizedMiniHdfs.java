// A Kerberized HDFS for the tests: Hadoop's MiniKdc (a real KDC, Apache Kerby) and a MiniDFSCluster with
// hadoop.security.authentication=kerberos, block access tokens and SASL data transfer protection, in one JVM,
// driven by stdin lines like MiniHdfs.java.
//
// Usage: java -cp <hadoop-client-minicluster/-api/-runtime jars>:<hadoop-minikdc jars>:<dir of this class>
//            KerberizedMiniHdfs <base dir> <client principal>...
// The KDC (realm EXAMPLE.COM, TCP on an ephemeral 127.0.0.1 port) gets the service principals hdfs/localhost and
// HTTP/localhost (keytab <base>/hdfs.keytab) and one keytab per client principal: <base>/<name>.keytab, name =
// the principal's first component. Lines printed on stdout (one event each):
//   KRB5_CONF <path>                 the krb5.conf that reaches this KDC (for KRB5_CONFIG of a client)
//   REALM <realm>
//   KEYTAB <principal>@<realm> <path>  one per client principal
//   NAMENODE hdfs://localhost:<port>   once the cluster is up, then READY
//   OK <command> / ERR <command>: <reason>   answer to each command line
// Commands: status | shutdown. End of stdin shuts everything down too.
// The DataNodes use SASL (dfs.data.transfer.protection=authentication) on unprivileged ports, which Hadoop allows
// only with ignore.secure.ports.for.testing (no HTTPS for the web UIs here; nothing reads them).
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.minikdc.MiniKdc;
import org.apache.hadoop.security.UserGroupInformation;

public final class KerberizedMiniHdfs {
    private KerberizedMiniHdfs() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: KerberizedMiniHdfs <base dir> <client principal>...");
            System.exit(2);
        }
        File base = new File(args[0]).getAbsoluteFile();
        File kdcDir = new File(base, "kdc");
        if (!kdcDir.isDirectory() && !kdcDir.mkdirs()) {
            throw new IllegalStateException("cannot create " + kdcDir);
        }
        Properties kdcConf = MiniKdc.createConf();
        kdcConf.setProperty(MiniKdc.KDC_BIND_ADDRESS, "127.0.0.1");
        kdcConf.setProperty(MiniKdc.KDC_PORT, "0");
        String lifetime = System.getProperty("riffle.kdc.max.ticket.lifetime.sec");
        if (lifetime != null) {
            kdcConf.setProperty(MiniKdc.MAX_TICKET_LIFETIME, lifetime);
        }
        MiniKdc kdc = new MiniKdc(kdcConf, kdcDir);
        kdc.start();
        String realm = kdc.getRealm();
        System.out.println("KRB5_CONF " + kdc.getKrb5conf().getAbsolutePath());
        System.out.println("REALM " + realm);

        File serviceKeytab = new File(base, "hdfs.keytab");
        kdc.createPrincipal(serviceKeytab, "hdfs/localhost", "HTTP/localhost");
        for (int i = 1; i < args.length; i++) {
            String name = args[i].split("[/@]")[0];
            File keytab = new File(base, name + ".keytab");
            kdc.createPrincipal(keytab, args[i]);
            System.out.println("KEYTAB " + args[i] + "@" + realm + " " + keytab.getAbsolutePath());
        }
        System.out.flush();

        String hdfsPrincipal = "hdfs/localhost@" + realm;
        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(base, "dfs").getAbsolutePath());
        conf.set("hadoop.security.authentication", "kerberos");
        conf.set("dfs.namenode.kerberos.principal", hdfsPrincipal);
        conf.set("dfs.namenode.keytab.file", serviceKeytab.getAbsolutePath());
        conf.set("dfs.datanode.kerberos.principal", hdfsPrincipal);
        conf.set("dfs.datanode.keytab.file", serviceKeytab.getAbsolutePath());
        conf.set("dfs.web.authentication.kerberos.principal", "HTTP/localhost@" + realm);
        conf.set("dfs.web.authentication.kerberos.keytab", serviceKeytab.getAbsolutePath());
        conf.setBoolean("dfs.block.access.token.enable", true);
        conf.set("dfs.data.transfer.protection", "authentication");
        conf.set("dfs.http.policy", "HTTP_ONLY");
        conf.setBoolean("ignore.secure.ports.for.testing", true);
        conf.set("dfs.replication", "1");
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.namenode.https-address", "127.0.0.1:0");
        conf.set("dfs.datanode.address", "127.0.0.1:0");
        conf.set("dfs.datanode.http.address", "127.0.0.1:0");
        conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
        conf.setBoolean("dfs.permissions.enabled", true);
        UserGroupInformation.setConfiguration(conf);

        MiniDFSCluster cluster;
        try {
            cluster = new MiniDFSCluster.Builder(conf).numDataNodes(1).format(true).build();
            cluster.waitActive();
            // the shuffle tree is the client principal's own (the NameNode checks permissions)
            org.apache.hadoop.fs.FileSystem fs = cluster.getFileSystem();
            for (int i = 1; i < args.length; i++) {
                String name = args[i].split("[/@]")[0];
                org.apache.hadoop.fs.Path home = new org.apache.hadoop.fs.Path("/" + name);
                fs.mkdirs(home);
                fs.setOwner(home, name, "supergroup");
            }
        } catch (Exception e) {
            kdc.stop();
            throw e;
        }
        System.out.println("NAMENODE hdfs://localhost:" + cluster.getNameNodePort());
        System.out.println("READY");
        System.out.flush();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        try {
            while ((line = in.readLine()) != null) {
                String cmd = line.trim();
                if (cmd.isEmpty()) {
                    continue;
                }
                if (cmd.equals("shutdown")) {
                    System.out.println("OK shutdown");
                    System.out.flush();
                    return;
                }
                if (cmd.equals("status")) {
                    System.out.println("OK status");
                } else {
                    System.out.println("ERR " + cmd + ": unknown command");
                }
                System.out.flush();
            }
        } finally {
            cluster.shutdown(true);
            kdc.stop();
            System.exit(0);
        }
    }
}
