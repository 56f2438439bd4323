// A Hadoop MiniDFSCluster for the tests (real NameNode + DataNodes in one JVM), driven by stdin lines.
//
// Usage: java -cp <hadoop-client-minicluster, -api, -runtime jars>:<dir of MiniHdfs.class> MiniHdfs <base dir> [data nodes]
// Ports are ephemeral (bound to 127.0.0.1). Lines printed on stdout (one event each):
//   NAMENODE hdfs://127.0.0.1:<port>     once the cluster is up, then READY
//   OK <command> / ERR <command>: <reason>   answer to each command line
// Commands read from stdin, one per line:
//   stop-datanode <i> | restart-datanode <i> | stop-namenode | restart-namenode | status | shutdown
// End of stdin (the test process died) shuts the cluster down too, so nothing outlives its owner.
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public final class MiniHdfs {
    private MiniHdfs() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: MiniHdfs <base dir> [data nodes]");
            System.exit(2);
        }
        File base = new File(args[0]);
        int dataNodes = args.length > 1 ? Integer.parseInt(args[1]) : 1;

        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getAbsolutePath());
        conf.set("dfs.replication", Integer.toString(Math.min(dataNodes, 3)));
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.namenode.https-address", "127.0.0.1:0");
        conf.set("dfs.datanode.address", "127.0.0.1:0");
        conf.set("dfs.datanode.http.address", "127.0.0.1:0");
        conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
        conf.setBoolean("dfs.permissions.enabled", false);
        // a stopped DataNode is declared dead quickly, so writes pick the others
        conf.setInt("dfs.heartbeat.interval", 1);
        conf.setInt("dfs.namenode.heartbeat.recheck-interval", 2000);

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
                .numDataNodes(dataNodes)
                .format(true)
                .build();
        cluster.waitActive();
        int nnPort = cluster.getNameNodePort();
        System.out.println("NAMENODE hdfs://127.0.0.1:" + nnPort);
        System.out.println("READY");
        System.out.flush();

        Map<Integer, MiniDFSCluster.DataNodeProperties> stopped = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        try {
            while ((line = in.readLine()) != null) {
                String cmd = line.trim();
                if (cmd.isEmpty()) {
                    continue;
                }
                String[] parts = cmd.split("\\s+");
                try {
                    switch (parts[0]) {
                        case "stop-datanode": {
                            int i = Integer.parseInt(parts[1]);
                            MiniDFSCluster.DataNodeProperties props = cluster.stopDataNode(i);
                            if (props == null) {
                                throw new IllegalArgumentException("no data node " + i);
                            }
                            stopped.put(i, props);
                            break;
                        }
                        case "restart-datanode": {
                            int i = Integer.parseInt(parts[1]);
                            MiniDFSCluster.DataNodeProperties props = stopped.remove(i);
                            if (props == null) {
                                throw new IllegalArgumentException("data node " + i + " is not stopped");
                            }
                            cluster.restartDataNode(props, true);
                            cluster.waitActive();
                            break;
                        }
                        case "stop-namenode":
                            cluster.shutdownNameNode(0);
                            break;
                        case "restart-namenode":
                            cluster.restartNameNode(0, true);
                            break;
                        case "status":
                            break;
                        case "shutdown":
                            System.out.println("OK shutdown");
                            System.out.flush();
                            return;
                        default:
                            throw new IllegalArgumentException("unknown command");
                    }
                    System.out.println("OK " + cmd);
                } catch (Exception e) {
                    System.out.println("ERR " + cmd + ": " + e);
                }
                System.out.flush();
            }
        } finally {
            cluster.shutdown(true);
            System.exit(0);
        }
    }
}
