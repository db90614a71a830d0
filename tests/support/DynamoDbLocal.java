// DynamoDB Local's wire server, bound to 127.0.0.1 (the jar's own launcher listens on every
// interface and has no option to bind one), with a control port on 127.0.0.1 that rolls every
// stream's open shard over: the wire API cannot, and a rollover is how a DynamoDB stream gets a
// child shard with a parent.
//
// Usage: java -Djava.library.path=<lib> -cp DynamoDBLocal.jar:<dir> DynamoDbLocal <port> <controlPort>
// GET /rollover on the control port rolls the shards over and answers once they have.
import com.sun.net.httpserver.HttpServer;
import java.lang.reflect.Field;
import java.net.InetSocketAddress;
import java.util.Map;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;
import software.amazon.dynamodb.services.local.shared.access.AmazonDynamoDBLocal;

public class DynamoDbLocal {
    static Object field(Object owner, Class<?> type, String name) throws Exception {
        Field field = type.getDeclaredField(name);
        field.setAccessible(true);
        return field.get(owner);
    }

    public static void main(String[] args) throws Exception {
        DynamoDBProxyServer server = ServerRunner.createServerFromCommandLineArgs(
            new String[] {"-inMemory", "-port", args[0], "-disableTelemetry"});
        Server jetty = (Server) field(server, DynamoDBProxyServer.class, "server");
        for (Connector connector : jetty.getConnectors()) {
            ((ServerConnector) connector).setHost("127.0.0.1");
        }
        server.start();
        Object handler = field(server, DynamoDBProxyServer.class, "serverHandler");
        Object primary = field(handler,
            Class.forName("software.amazon.dynamodb.services.local.server.AbstractLocalDynamoDBServerHandler"),
            "primaryHandler");
        @SuppressWarnings("unchecked")
        Map<String, AmazonDynamoDBLocal> databases = (Map<String, AmazonDynamoDBLocal>) field(primary,
            Class.forName("software.amazon.dynamodb.services.local.server.LocalDynamoDBRequestHandler"),
            "dbRequestHandlers");
        HttpServer control = HttpServer.create(
            new InetSocketAddress("127.0.0.1", Integer.parseInt(args[1])), 0);
        control.createContext("/rollover", exchange -> {
            String answer;
            try {
                synchronized (databases) {
                    for (AmazonDynamoDBLocal database : databases.values()) {
                        database.triggerShardRollovers();
                    }
                    answer = "rolled over " + databases.size() + " database(s)\n";
                }
            } catch (Exception error) {
                answer = "error: " + error + "\n";
            }
            byte[] body = answer.getBytes();
            exchange.sendResponseHeaders(200, body.length);
            exchange.getResponseBody().write(body);
            exchange.close();
        });
        control.start();
        server.join();
    }
}
