// TLS and mutual TLS between real ember-server processes and the client
// library, with certificates made at test time by openssl
// (tests/server/make_test_certs.sh): a TLS shard serves a TLS client and
// refuses plaintext ones; under mTLS a client without a certificate, or
// with one from another CA, is refused in the handshake; bad TLS flags stop
// the server with a message naming the flag or the file.
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "gtest/gtest.h"
#include "server/health_check.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

class TlsIntegrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/ember_tls_" + std::to_string(getpid()));
    std::string out;
    const int rc = RunCommand({"bash", EMBER_MAKE_CERTS, *dir_}, "", &out);
    ASSERT_EQ(rc, 0) << out;
  }
  static void TearDownTestSuite() {
    std::string out;
    RunCommand({"rm", "-rf", *dir_}, "", &out);
    delete dir_;
  }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  std::unique_ptr<ServerProcess> StartShard(bool mutual) {
    std::vector<std::string> flags = {"--tls_cert=" + File("server.pem"),
                                      "--tls_key=" + File("server.key")};
    if (mutual) flags.push_back("--tls_client_ca=" + File("ca.pem"));
    absl::StatusOr<std::unique_ptr<ServerProcess>> p = ServerProcess::Start(flags);
    EXPECT_OK(p);
    return p.ok() ? std::move(*p) : nullptr;
  }

  // A client of `shard`; connect_timeout short: refused handshakes retry
  // until it passes.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ServerProcess& shard,
                                                         const ClientTlsOptions& tls) {
    ClientOptions o;
    o.shards = {shard.address()};
    o.tls = tls;
    o.connect_timeout = absl::Seconds(2);
    return Client::Connect(o);
  }
  // A refused handshake: Connect gives up after connect_timeout, saying
  // what to check.
  static void ExpectRefused(const absl::StatusOr<std::unique_ptr<Client>>& client) {
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded) << client.status();
    EXPECT_NE(client.status().message().find("TLS settings"), std::string::npos)
        << client.status();
  }
  static ClientTlsOptions Trusting(const std::string& cert = "", const std::string& key = "") {
    ClientTlsOptions tls;
    tls.enabled = true;
    tls.ca_file = File("ca.pem");
    tls.cert_file = cert;
    tls.key_file = key;
    return tls;
  }
  // Creates a table and reads rows back: the whole path works.
  static void ExpectServes(Client& client) {
    ASSERT_OK(client.CreateTable(AdagradTable("t", 4)));
    absl::StatusOr<std::vector<float>> rows = client.LookupRows("t", {1, 2, 3}, false);
    ASSERT_OK(rows);
    EXPECT_EQ(rows->size(), 12u);
    absl::StatusOr<uint64_t> stored = client.StoredRows("t");
    ASSERT_OK(stored);
    EXPECT_EQ(*stored, 3u);
  }

  static std::string* dir_;
};
std::string* TlsIntegrationTest::dir_ = nullptr;

TEST_F(TlsIntegrationTest, ATlsShardServesATlsClientAndRefusesPlaintext) {
  std::unique_ptr<ServerProcess> shard = StartShard(/*mutual=*/false);
  ASSERT_NE(shard, nullptr);
  absl::StatusOr<std::unique_ptr<Client>> tls = Connect(*shard, Trusting());
  ASSERT_OK(tls);
  ExpectServes(**tls);
  ExpectRefused(Connect(*shard, {}));
  // The health check reaches it over TLS only.
  EXPECT_OK(CheckHealth(shard->address(), absl::Seconds(5), "", Trusting()));
  EXPECT_FALSE(CheckHealth(shard->address(), absl::Seconds(2)).ok());
}

TEST_F(TlsIntegrationTest, AClientThatDoesNotTrustTheShardsCaIsRefused) {
  std::unique_ptr<ServerProcess> shard = StartShard(/*mutual=*/false);
  ASSERT_NE(shard, nullptr);
  ClientTlsOptions wrong_ca = Trusting();
  wrong_ca.ca_file = File("rogue-ca.pem");
  ExpectRefused(Connect(*shard, wrong_ca));
}

TEST_F(TlsIntegrationTest, MutualTlsRefusesClientsWithoutACertificateOrWithAnUnknownOne) {
  std::unique_ptr<ServerProcess> shard = StartShard(/*mutual=*/true);
  ASSERT_NE(shard, nullptr);
  absl::StatusOr<std::unique_ptr<Client>> known =
      Connect(*shard, Trusting(File("client.pem"), File("client.key")));
  ASSERT_OK(known);
  ExpectServes(**known);
  ExpectRefused(Connect(*shard, Trusting()));
  ExpectRefused(Connect(*shard, Trusting(File("rogue.pem"), File("rogue.key"))));
  ExpectRefused(Connect(*shard, {}));
}

TEST_F(TlsIntegrationTest, BadTlsSettingsAreRefusedNamingTheFlagOrTheFile) {
  std::string out;
  int rc = RunCommand({"timeout", "20", EMBER_SERVER_BIN, "--port=0",
                       "--tls_cert=" + File("server.pem")}, "", &out);
  ASSERT_TRUE(WIFEXITED(rc)) << out;
  EXPECT_NE(WEXITSTATUS(rc), 0) << out;
  EXPECT_NE(out.find("--tls_key"), std::string::npos) << out;
  rc = RunCommand({"timeout", "20", EMBER_SERVER_BIN, "--port=0", "--tls_cert=" + File("nope.pem"),
                   "--tls_key=" + File("server.key")}, "", &out);
  ASSERT_TRUE(WIFEXITED(rc)) << out;
  EXPECT_NE(WEXITSTATUS(rc), 0) << out;
  EXPECT_NE(out.find(File("nope.pem")), std::string::npos) << out;
  rc = RunCommand({"timeout", "20", EMBER_SERVER_BIN, "--port=0", "--tls_cert=" + File("server.ext"),
                   "--tls_key=" + File("server.key")}, "", &out);
  ASSERT_TRUE(WIFEXITED(rc)) << out;
  EXPECT_NE(WEXITSTATUS(rc), 0) << out;
  EXPECT_NE(out.find("expected a PEM file"), std::string::npos) << out;
  // The client side: a certificate without its key.
  ClientOptions o;
  o.shards = {"127.0.0.1:1"};
  o.tls = Trusting(File("client.pem"), "");
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
}

}  // namespace
}  // namespace ember::testing
