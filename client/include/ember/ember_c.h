/* Ember's trainer library behind a C ABI: the one way other languages and
 * frameworks (the Python package, TensorFlow and PyTorch ops) reach it.
 *
 * Why C: libember_c.so carries its own gRPC, protobuf, Abseil and OpenSSL,
 * linked statically with every symbol hidden but the ember_* functions below,
 * so it can live in one process with TensorFlow or PyTorch, which export
 * other versions of those libraries. Objects made through it (clients,
 * pipelines) can be shared by every module of the process that loads it.
 *
 * Errors: a function returns an int status code, gRPC's numbering (0 = OK,
 * 3 = INVALID_ARGUMENT, 9 = FAILED_PRECONDITION, 14 = UNAVAILABLE, ...); the
 * message of the calling thread's last failure is ember_last_error().
 *
 * Threads: every function may be called from any thread; a client is shared;
 * a pipeline's prefetches come from one thread, its waits and pushes from
 * one thread (the same or another: see ember::StepPipeline).
 * None of them calls back into the caller, but for one: a transport made
 * with ember_transport_create runs its all-to-all callback on the thread of
 * the pipeline that uses it.
 *
 * Memory: pointers passed in are read during the call only (copied where kept);
 * strings returned through `char**` are the caller's, freed with
 * ember_free_string. All buffers are host memory.
 */
#ifndef EMBER_EMBER_C_H_
#define EMBER_EMBER_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EMBER_C_API __attribute__((visibility("default")))

typedef struct ember_client ember_client;
typedef struct ember_pipeline ember_pipeline;
typedef struct ember_merger ember_merger;
typedef struct ember_transport ember_transport;

/* The message of the calling thread's last failed call ("" after none).
 * Valid until the thread's next failing call. */
EMBER_C_API const char* ember_last_error(void);
EMBER_C_API void ember_free_string(char* s);

/* --- Client (ember::Client) ------------------------------------------- */

typedef struct {
  /* "host:port" per shard, in shard order; or the one entry "inproc:N": N
   * shards in this process (ember::InProcessOptions). */
  const char* const* shards;
  size_t num_shards;
  double rpc_timeout_s;      /* <= 0: the library's default (10 s) */
  double connect_timeout_s;  /* <= 0: 10 s */
  double retry_budget_s;     /* < 0: 30 s; 0: no retries */
  /* TLS to the shards (fields added after the ones above: zero-initialise
   * the struct). tls_enabled 0: plaintext, and the files must be unset. */
  int tls_enabled;
  const char* tls_ca_file;      /* PEM CA of the shards; NULL or "": system roots */
  const char* tls_cert_file;    /* PEM client certificate (mutual TLS); NULL: none */
  const char* tls_key_file;     /* PEM key of tls_cert_file */
  const char* tls_server_name;  /* name the shards' certificates carry; NULL: the host */
  const char* auth_token;       /* bearer token for --auth_tokens_file shards; NULL: none */
  /* In-process shards' checkpoints (ember::InProcessOptions): directory
   * (NULL: none) and "latest" or an id to restore (NULL: start empty). */
  const char* inproc_checkpoint_dir;
  const char* inproc_restore_from;
} ember_client_options;

EMBER_C_API int ember_client_connect(const ember_client_options* options, ember_client** out);
/* Pipelines made from the client must be freed first. */
EMBER_C_API void ember_client_free(ember_client* client);
EMBER_C_API uint32_t ember_client_shard_count(const ember_client* client);
/* config_json: an ember.v1.TableConfig in protobuf's JSON mapping. */
EMBER_C_API int ember_client_create_table(ember_client* client, const char* config_json);
/* *out_json: a JSON array of ember.v1.TableInfo as shard 0 holds them. */
EMBER_C_API int ember_client_list_tables(ember_client* client, char** out_json);
/* *out_json: a JSON array of ember.v1.GetShardInfoResponse, shard i's at i. */
EMBER_C_API int ember_client_shard_infos(ember_client* client, char** out_json);
EMBER_C_API int ember_client_stored_rows(ember_client* client, const char* table, uint64_t* out);
/* Rows of keys[0..num_keys) of `table` into out (num_keys x dim floats;
 * out_len must be exactly that). read_only = 0 inserts missing rows. */
EMBER_C_API int ember_client_lookup_rows(ember_client* client, const char* table,
                                         const uint64_t* keys, size_t num_keys, int read_only,
                                         float* out, size_t out_len);
/* options_json: {"id": str, "step": int, "incremental": bool, "timeout_s": num},
 * every field optional (see ember::CheckpointOptions). *out_json:
 * {"step": int, "id": str, "shards": [CheckpointResponse JSON, ...]}. */
EMBER_C_API int ember_client_checkpoint(ember_client* client, const char* options_json,
                                        char** out_json);

/* --- Step pipeline (ember::StepPipeline) ------------------------------ */

enum { EMBER_COMBINER_SUM = 0, EMBER_COMBINER_MEAN = 1, EMBER_COMBINER_SQRTN = 2 };

typedef struct {
  const char* name;
  const char* table;
  int combiner; /* EMBER_COMBINER_* */
} ember_feature_spec;

typedef struct {
  uint32_t worker_id;
  const ember_feature_spec* features;
  size_t num_features;
  int staleness;       /* negative: asynchronous */
  int prefetch_depth;  /* -1: max(1, staleness), 2 with early fetch */
  int64_t first_step;
  /* Nonzero: no early fetch at staleness 0 (PipelineOptions::early_fetch
   * false); zero, the default, fetches early. */
  int no_early_fetch;
  /* Several pipelines of one process (fields added after the ones above:
   * zero-initialise the struct): the merger they share (NULL: none) and
   * this pipeline's rank in it; staleness and first_step must equal the
   * merger's (ember::PipelineOptions::merger). */
  ember_merger* merger;
  int merger_rank;
  /* Several processes of one node (fields added after the ones above):
   * this rank's transport (NULL: none; not with a merger) and, nonzero,
   * the node is one SSP worker (ember::PipelineOptions::node_transport,
   * node_one_worker). The transport must outlive the pipeline. */
  ember_transport* node_transport;
  int node_one_worker;
} ember_pipeline_options;

/* One feature of one step in CSR form (ember::FeatureBatch). weights may be
 * NULL (num_weights 0) for all-ones. */
typedef struct {
  const int64_t* offsets;
  size_t num_offsets; /* batch_size + 1 */
  const uint64_t* keys;
  size_t num_keys;
  const float* weights;
  size_t num_weights;
} ember_feature_batch;

/* The client must outlive the pipeline. */
EMBER_C_API int ember_pipeline_create(ember_client* client, const ember_pipeline_options* options,
                                      ember_pipeline** out);
/* Closes (flush, unregister; errors dropped) and frees. */
EMBER_C_API void ember_pipeline_free(ember_pipeline* pipeline);
EMBER_C_API size_t ember_pipeline_num_features(const ember_pipeline* pipeline);
/* 0 when feature >= ember_pipeline_num_features. */
EMBER_C_API uint32_t ember_pipeline_dim(const ember_pipeline* pipeline, size_t feature);
EMBER_C_API int ember_pipeline_prefetch_depth(const ember_pipeline* pipeline);
/* features: one per pipeline feature, in order; copied before returning. */
EMBER_C_API int ember_pipeline_prefetch(ember_pipeline* pipeline, int64_t step,
                                        const ember_feature_batch* features, size_t num_features);
/* As ember_pipeline_prefetch, but first waits (at most timeout_s) until the
 * step fits in the prefetch depth, i.e. until step - prefetch_depth - 1 has
 * been pushed: for an input pipeline (tf.data) that runs ahead of training on
 * its own thread. Prefetch may run on such a thread while another drives
 * wait and push. DEADLINE_EXCEEDED when the wait times out, CANCELLED when
 * the pipeline is closed meanwhile or *cancel (if not NULL; read atomically,
 * every few milliseconds) becomes nonzero; nothing is prefetched then. */
EMBER_C_API int ember_pipeline_prefetch_blocking(ember_pipeline* pipeline, int64_t step,
                                                 const ember_feature_batch* features,
                                                 size_t num_features, double timeout_s,
                                                 const int* cancel);
/* Staged steps, for an input pipeline that may be iterated more than once
 * or dropped early (tf.data: a new iterator per epoch, Keras drawing an
 * element before training): the input pipeline stages each batch (copied;
 * returns at once) and gets a ticket; training claims tickets in order.
 * A claim gives the ticket the pipeline's next step and prefetches it (and
 * staged tickets after it, as far as the prefetch depth allows); a staged
 * ticket older than the one claimed was drawn and never trained, and is
 * dropped. Pushes prefetch staged tickets ahead the same way. Tickets count
 * from first_step, so they equal the steps while every staged batch is
 * trained. All from the training thread except stage. FAILED_PRECONDITION
 * when a ticket was never staged or an older one was already prefetched (its
 * element was dropped after its rows were fetched). */
EMBER_C_API int ember_pipeline_stage(ember_pipeline* pipeline, const ember_feature_batch* features,
                                     size_t num_features, int64_t* ticket);
/* Blocks (at most timeout_s) while the prefetch depth is full; *step is the
 * ticket's step. Claiming a claimed ticket again gives its step. */
EMBER_C_API int ember_pipeline_claim(ember_pipeline* pipeline, int64_t ticket, double timeout_s,
                                     int64_t* step);
/* The step of a claimed ticket not yet pushed (for its push); no effect.
 * FAILED_PRECONDITION for another ticket. */
EMBER_C_API int ember_pipeline_ticket_step(ember_pipeline* pipeline, int64_t ticket,
                                           int64_t* step);
/* Blocks until step's rows are pooled, then copies feature f's
 * [batch_size, dim(f)] rows into out[f], whose length out_lens[f] must be
 * batch_size * dim(f) (INVALID_ARGUMENT otherwise). *batch_size is set on
 * success; pass out = NULL to learn it (the rows are then not copied, and a
 * second call with buffers is allowed for the same step). */
EMBER_C_API int ember_pipeline_wait(ember_pipeline* pipeline, int64_t step, int64_t* batch_size,
                                    float* const* out, const size_t* out_lens, size_t num_out);
/* d_pooled[f]: batch_size * dim(f) floats (lens checked); copied. */
EMBER_C_API int ember_pipeline_push(ember_pipeline* pipeline, int64_t step,
                                    const float* const* d_pooled, const size_t* lens, size_t num);
/* The same two with every feature side by side in one row-major
 * [batch_size, D] buffer, D the sum of the features' dims, feature f in the
 * columns after those of features 0..f-1 (TorchRec's KeyedTensor layout):
 * len must be batch_size * D. wait_packed with out = NULL only sets
 * *batch_size. */
EMBER_C_API int ember_pipeline_wait_packed(ember_pipeline* pipeline, int64_t step,
                                           int64_t* batch_size, float* out, size_t len);
EMBER_C_API int ember_pipeline_push_packed(ember_pipeline* pipeline, int64_t step,
                                           const float* d_pooled, size_t len);
EMBER_C_API int ember_pipeline_flush(ember_pipeline* pipeline);
EMBER_C_API int ember_pipeline_close(ember_pipeline* pipeline);

typedef struct {
  int64_t steps_waited;
  int64_t steps_pushed;
  double wait_seconds;
  double max_wait_seconds;
  uint64_t keys;
  uint64_t unique_keys;
  uint64_t bytes_sent;
  uint64_t bytes_received;
  /* Early fetch at staleness 0 (ember::PipelineStats). */
  uint64_t steps_patched;
  uint64_t rows_patched;
  uint64_t patch_bytes;
  uint64_t steps_refetched;
  uint64_t rows_refetched;
  uint64_t keys_refetched;
} ember_pipeline_stats;

EMBER_C_API void ember_pipeline_stats_get(const ember_pipeline* pipeline,
                                          ember_pipeline_stats* out);

/* --- Step merger (ember::StepMerger) ------------------------------------ */

/* The pipelines of one process (one per GPU or per framework replica) send
 * one request per shard per step between them: each rank's pipeline is made
 * with ember_pipeline_options.merger and its rank, and the ranks make the
 * same calls in the same order (ember/step_merger.h). The node is one SSP
 * worker, `worker_id`. */
typedef struct {
  int ranks;           /* >= 1 */
  uint32_t worker_id;
  int staleness;       /* negative: asynchronous */
  int64_t first_step;
  double timeout_s;    /* a rank waiting longer for the others fails; <= 0: 60 s */
  int no_early_fetch;  /* as ember_pipeline_options.no_early_fetch, for the node */
} ember_merger_options;

EMBER_C_API int ember_merger_create(ember_client* client, const ember_merger_options* options,
                                    ember_merger** out);
/* Its pipelines must be freed first; unregisters the node's worker. */
EMBER_C_API void ember_merger_free(ember_merger* merger);

typedef struct {
  int64_t rounds;        /* merged exchanges sent */
  int64_t fetch_rounds;  /* of which carried a fetch */
  uint64_t rank_keys;    /* unique keys the ranks asked for, summed over ranks */
  uint64_t merged_keys;  /* keys fetched after merging */
} ember_merger_stats;

EMBER_C_API void ember_merger_stats_get(const ember_merger* merger, ember_merger_stats* out);

/* --- Node transport (ember::ShuffleTransport) -------------------------- */

/* The ranks of a node in several processes share their keys, rows and
 * gradients through an all-to-all the caller provides (in Python:
 * torch.distributed). One call of `fn`: send[r] (send_sizes[r] bytes) goes
 * to rank r; before returning 0, `fn` hands what rank r sent to this rank
 * to ember_alltoall_recv_set(recv, r, ...), for every r. On failure it
 * calls ember_alltoall_recv_fail(recv, message) and returns a gRPC code;
 * the pipeline then fails with it. Every rank's `fn` is called in the same
 * order, from its pipeline's background thread; `recv` is valid during the
 * call only. */
typedef struct ember_alltoall_recv ember_alltoall_recv;
typedef int (*ember_alltoall_fn)(void* user, uint32_t ranks, const uint8_t* const* send,
                                 const size_t* send_sizes, ember_alltoall_recv* recv);
/* INVALID_ARGUMENT for a rank out of range. Copies `data`. */
EMBER_C_API int ember_alltoall_recv_set(ember_alltoall_recv* recv, uint32_t rank,
                                        const uint8_t* data, size_t size);
EMBER_C_API void ember_alltoall_recv_fail(ember_alltoall_recv* recv, const char* message);

/* Rank `rank` of `size` over `fn` (`user` passed through, not owned). */
EMBER_C_API int ember_transport_create(uint32_t rank, uint32_t size, ember_alltoall_fn fn,
                                       void* user, ember_transport** out);
/* `size` connected transports for threads of this process (rank i in
 * out[i]; ember::NewInProcessTransports). */
EMBER_C_API int ember_transports_in_process(uint32_t size, ember_transport** out);
/* Its pipeline must be freed first. */
EMBER_C_API void ember_transport_free(ember_transport* transport);

/* --- Pooling (the host code the pipeline uses) ----------------------- */

/* pooled[i, :] = combine over ids j of example i of rows[inverse[j], :]
 * (ember::PoolForward): offsets has batch + 1 entries, inverse and weights
 * (NULL: all 1) one per id, rows num_rows x dim, pooled batch x dim
 * (overwritten). Checked: offsets well formed, inverse[j] < num_rows. */
EMBER_C_API int ember_pool_forward(const int64_t* offsets, size_t num_offsets,
                                   const uint32_t* inverse, size_t num_ids,
                                   const float* weights, int combiner, const float* rows,
                                   size_t num_rows, uint32_t dim, float* pooled);
/* Its gradient (ember::PoolBackward): d_rows (num_rows x dim) is zeroed,
 * then gets every id's share of d_pooled (batch x dim), duplicates summed. */
EMBER_C_API int ember_pool_backward(const int64_t* offsets, size_t num_offsets,
                                    const uint32_t* inverse, size_t num_ids,
                                    const float* weights, int combiner, const float* d_pooled,
                                    size_t num_rows, uint32_t dim, float* d_rows);

#ifdef __cplusplus
}
#endif

#endif /* EMBER_EMBER_C_H_ */
