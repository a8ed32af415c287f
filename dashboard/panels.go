package dashboard

// The panels, by group, in the order an operator reads them: is money
// moving, what waits and why, what was set aside, and then each thing it
// depends on.

// quantile is the q-quantile of a histogram's series selected by sel.
func quantile(q, histogram, sel string) string {
	return "histogram_quantile(" + q + ", sum by (le) (rate(" + histogram + "_bucket{" + sel + "}[$__rate_interval])))"
}

// alarm is whether any node of the RabbitMQ cluster that serves the
// vhost's queues has the alarm of series on (one of the plugin's
// rabbitmq_alarms_* series, which it exports at /metrics, not at
// /metrics/detailed): an alarm on any node blocks every publish
// of the cluster. Each node's cluster is its rabbitmq_identity_info's,
// which both endpoints export, so that the two scrapes meet by cluster
// whatever their targets are named.
func alarm(series string) string {
	return `max by (rabbitmq_cluster) (` + series + ` * on (instance, job) group_left (rabbitmq_cluster) rabbitmq_identity_info)` +
		` and on (rabbitmq_cluster) (rabbitmq_identity_info and on (instance, job) rabbitmq_detailed_queue_messages{vhost=~"$vhost"})`
}

func groups() []group {
	return []group{
		{"Events", []panel{
			lines{title: "Events per second by queue and outcome", unit: "ops",
				description: "Deliveries decided per second: applied, duplicate (the inbox already held the eventId), dead_lettered (by failure class) and requeued.",
				queries: []query{{
					`sum by (queue, outcome, class) (rate(transferconsumer_events_total{` + onQueue + `}[$__rate_interval]))`,
					"{{queue}} {{outcome}} {{class}}"}}},
			lines{title: "Apply latency", unit: "s",
				description: "From receiving an event to its ack after the commit, for the events applied: the median and the 99th percentile.",
				queries: []query{
					{quantile("0.5", "transferconsumer_event_processing_seconds", onQueue+`, outcome="applied"`), "p50"},
					{quantile("0.99", "transferconsumer_event_processing_seconds", onQueue+`, outcome="applied"`), "p99"}}},
			lines{title: "Batch size", unit: "none",
				description: "Events taken in one transaction, with BATCH_MAX above 1 (adr/0006): how full the batches are.",
				queries: []query{
					{`sum(rate(transferconsumer_batch_size_sum{` + onInstance + `}[$__rate_interval])) / sum(rate(transferconsumer_batch_size_count{` + onInstance + `}[$__rate_interval]))`, "mean"},
					{quantile("0.99", "transferconsumer_batch_size", onInstance), "p99"}}},
		}},
		{"Blocked queues and retries", []panel{
			rows{title: "Blocked queues", unit: "s", value: "blocked for",
				description: "Each queue retrying its message in hand because the environment failed (adr/0002), for how long, and why. /readyz has the event and the error itself.",
				queries: []query{{
					`(time() - (transferconsumer_queue_blocked_since_seconds{` + onQueue + `} > 0)) * on (instance, queue) group_left (reason, class) transferconsumer_queue_blocked_reason{` + onQueue + `}`,
					"{{queue}} {{reason}}"}}},
			lines{title: "Blocked queues by reason", unit: "none",
				description: "How many queues were blocked, over time, by reason: the database's (statement-timeout, unavailable, read-only, …), the journal's (journal-stalled: neither the stream nor the database takes its entries; journal-unread, journal-unvouched: it must read the journal and cannot; journal-restore; journal-unrestorable: it waits for recover --accept-loss), panic, unknown.",
				queries: []query{{
					`count by (reason) (transferconsumer_queue_blocked_reason{` + onQueue + `})`,
					"{{reason}}"}}},
			lines{title: "Retries in place by reason", unit: "ops",
				description: "Transient failures retried without returning the message, by queue and reason (statement-timeout, unavailable, read-only, no-sync-standby, …).",
				queries: []query{{
					`sum by (queue, reason) (rate(transferconsumer_db_retries_total{` + onQueue + `}[$__rate_interval]))`,
					"{{queue}} {{reason}}"}}},
		}},
		{"Dead letters", []panel{
			lines{title: "Dead-letter queue depth", unit: "none",
				description: "Dead letters waiting, as the service reads them every 10 s; with rabbitmq_prometheus, the DLQ's ready letters and those a reader holds (dlq list, a replay, the management UI).",
				queries: []query{
					{`max(transferconsumer_dlq_messages{` + onInstance + `} >= 0)`, "waiting (the service's read)"},
					{`sum by (queue) (rabbitmq_detailed_queue_messages_ready{vhost=~"$vhost", queue=~".+\\.dlq"})`, "{{queue}} ready"},
					{`sum by (queue) (rabbitmq_detailed_queue_messages_unacked{vhost=~"$vhost", queue=~".+\\.dlq"})`, "{{queue}} held by a reader"}}},
			lines{title: "Dead letters by class", unit: "none", bars: true,
				description: "Events dead-lettered, by failure class: poison, producer-conflict, invalid-transition, data-rejected, unauthorized, panic. transferconsumer dlq list shows each letter's reason.",
				queries: []query{{
					`sum by (class) (increase(transferconsumer_events_total{` + onQueue + `, outcome="dead_lettered"}[$__rate_interval]))`,
					"{{class}}"}}},
		}},
		{"Producers", []panel{
			lines{title: "Producer conflicts and unauthorized events", unit: "none", bars: true,
				description: "An eventId applied before with other content (the producer_conflict table has both), and events from a publisher PRODUCERS does not list (adr/0008): each pages.",
				queries: []query{
					{`sum(increase(transferconsumer_producer_conflicts_total{` + onInstance + `}[$__rate_interval]))`, "producer conflicts"},
					{`sum(increase(transferconsumer_events_total{` + onQueue + `, outcome="dead_lettered", class="unauthorized"}[$__rate_interval]))`, "unauthorized"}}},
		}},
		{"Reconciliation", []panel{
			figure{title: "Reconciliation findings", red: ptr(1.0),
				description: "What the last periodic reconciliation found (adr/0007), across replicas; -1 before a first run. transferconsumer reconcile lists each. Transfers changed since the checkpoint (history edited) stay until a person resolves them.",
				mappings:    map[string]string{"-1": "not run yet"},
				queries: []query{
					{`max(transferconsumer_reconcile_accounts_in_drift{` + onInstance + `})`, "accounts in drift"},
					{`max(transferconsumer_reconcile_changed_since_checkpoint{` + onInstance + `})`, "transfers changed since the checkpoint"},
					{`max(transferconsumer_reconcile_duplicate_intents{` + onInstance + `})`, "duplicate intents"},
					{`max(transferconsumer_reconcile_waiting_transitions{` + onInstance + `})`, "transitions waiting"},
					{`max(transferconsumer_reconcile_old_dead_letters{` + onInstance + `})`, "dead letters past INBOX_TTL"}}},
			rows{title: "Reconciliation checkpoint", value: "trusted",
				description: "Whether the last periodic pass of each instance trusted the checkpoint (1) and started from it, or not (0) and made it anew in a full pass, and why: none (the first pass), forgotten (it neutralized another cluster's transaction ids), copied (a dump restored, logical replication), incomplete, transfers-gone (the transfer table restored, or changed by hand), marked (the standby's full pass found transfers changed since it, or a person marked it). The log's reconciled line has the words (checkpoint_not_trusted).",
				queries: []query{{
					`transferconsumer_reconcile_checkpoint_trusted{` + onInstance + `} >= 0`,
					"{{instance}} {{reason}}"}}},
			figure{title: "Last reconciliation", unit: "s", red: ptr(3 * 3600.0),
				description: "How long ago the last pass of any replica ended, and how long it took. Nothing before a first run (a minute after start, then every RECONCILE_INTERVAL).",
				queries: []query{
					{`time() - max(transferconsumer_reconcile_last_run_end_seconds{` + onInstance + `} > 0)`, "since the last pass"},
					{`max(transferconsumer_reconcile_last_run_duration_seconds{` + onInstance + `})`, "the pass took"}}},
		}},
		{"Journal (JOURNAL_STREAM)", []panel{
			lines{title: "Journal hold time", unit: "s",
				description: "From a transaction's commit until the journal's stream confirmed its entries, or the database kept them: how long its acks waited for the journal (adr/0014).",
				queries: []query{
					{quantile("0.5", "transferconsumer_journal_hold_seconds", onQueue), "p50"},
					{quantile("0.99", "transferconsumer_journal_hold_seconds", onQueue), "p99"}}},
			lines{title: "Journal stalls and restores", unit: "none", bars: true,
				description: "Stalls: a queue's acks began to wait because neither the stream nor the database took its entries. Restores: entries applied again because the database had lost them.",
				queries: []query{
					{`sum by (queue) (increase(transferconsumer_journal_stalls_total{` + onQueue + `}[$__rate_interval]))`, "{{queue}} stalls"},
					{`sum(increase(transferconsumer_journal_restored_total{` + onInstance + `}[$__rate_interval]))`, "entries applied again"}}},
			lines{title: "Events the journal does not protect", unit: "none",
				description: "Unprotected: acked events whose entries are kept in the database while the stream does not take them (a failover or restore that loses their commits loses them). Lost: acked events such a loss took while their entries were kept, in neither the database nor the journal (the ERROR line 'journal: acked events lost' names their sequences). Unrestorable: events in neither the database nor the journal; the queue waits for recover --accept-loss.",
				queries: []query{
					{`sum by (queue) (transferconsumer_journal_unprotected_events{` + onQueue + `})`, "{{queue}} unprotected"},
					{`sum by (queue) (increase(transferconsumer_journal_lost_events_total{` + onQueue + `}[$__rate_interval]))`, "{{queue}} lost"},
					{`sum by (queue) (transferconsumer_journal_unrestorable_events{` + onQueue + `})`, "{{queue}} unrestorable"},
					{`sum(increase(transferconsumer_journal_kept_total{` + onInstance + `}[$__rate_interval]))`, "entries kept in the database"}}},
			lines{title: "Journal reads", unit: "Bps",
				description: "Bytes of journal messages the reads of the stream passed over, by instance: at start, after the database lost commits, when the database cannot vouch for a queue's mark, at a handover. What a restore or a handover costs the broker; a read that goes far back (JOURNAL_CLOCK_SKEW, an idle queue's old mark) shows here.",
				queries: []query{{
					`sum by (instance) (rate(transferconsumer_journal_read_bytes_total{` + onInstance + `}[$__rate_interval]))`,
					"{{instance}}"}}},
		}},
		{"Database", []panel{
			figure{title: "Database and its standby",
				description: "Whether each instance reaches the database, and whether the database names a synchronous standby: without one, a failover may lose events already acked (adr/0001), unless the journal is on.",
				mappings:    map[string]string{"1": "yes", "0": "no", "-1": "not read yet"},
				queries: []query{
					{`min(transferconsumer_database_up{` + onInstance + `})`, "reached"},
					{`min(transferconsumer_database_synchronous_standby{` + onInstance + `})`, "synchronous standby"}}},
			lines{title: "Connection pool", unit: "none",
				description: "The pool's connections in use and idle against its size (DB_MAX_CONNS), and the waits for a free one.",
				queries: []query{
					{`sum by (instance) (go_sql_in_use_connections{` + onInstance + `, db_name="transferconsumer"})`, "{{instance}} in use"},
					{`sum by (instance) (go_sql_idle_connections{` + onInstance + `, db_name="transferconsumer"})`, "{{instance}} idle"},
					{`sum by (instance) (go_sql_max_open_connections{` + onInstance + `, db_name="transferconsumer"})`, "{{instance}} most"},
					{`sum by (instance) (increase(go_sql_wait_count_total{` + onInstance + `, db_name="transferconsumer"}[$__rate_interval]))`, "{{instance}} waits"}}},
			lines{title: "Statement timeouts", unit: "none", bars: true,
				description: "Attempts APPLY_TIMEOUT (or the role's statement_timeout) ended on the server, by queue: each is retried in place.",
				queries: []query{{
					`sum by (queue) (increase(transferconsumer_db_retries_total{` + onQueue + `, reason="statement-timeout"}[$__rate_interval]))`,
					"{{queue}}"}}},
		}},
		{"Consumers", []panel{
			figure{title: "Replicas",
				description: "Instances with a broker connection, and those that consume every partition queue.",
				queries: []query{
					{`count(transferconsumer_broker_connected{` + onInstance + `} == 1) or vector(0)`, "connected"},
					{`count(transferconsumer_queues_consumed{` + onInstance + `} >= on (instance) transferconsumer_queue_count{` + onInstance + `}) or vector(0)`, "consuming every queue"}}},
			lines{title: "Queues by instance", unit: "none",
				description: "Queues each instance has a consumer on, and those whose events it applied in the last 5 minutes: with single active consumer, the queues it owns (an idle queue shows no owner).",
				queries: []query{
					{`sum by (instance) (transferconsumer_queues_consumed{` + onInstance + `})`, "{{instance}} consuming"},
					{`count by (instance) (sum by (instance, queue) (increase(transferconsumer_events_total{` + onQueue + `}[5m])) > 0)`, "{{instance}} owns"}}},
		}},
		{"RabbitMQ (rabbitmq_prometheus)", []panel{
			lines{title: "Queue depth", unit: "none",
				description: "The broker's own count of each partition queue's messages: ready to be delivered, and delivered but not yet acked (a blocked queue holds its message in hand).",
				queries: []query{
					{`sum by (queue) (rabbitmq_detailed_queue_messages_ready{` + onBroker + `})`, "{{queue}} ready"},
					{`sum by (queue) (rabbitmq_detailed_queue_messages_unacked{` + onBroker + `})`, "{{queue}} unacked"}}},
			lines{title: "Broker alarms", unit: "none",
				description: "1 while a node of the cluster serving the vhost has its memory, disk or file descriptor alarm on (rabbitmq_prometheus's /metrics; prometheus/prometheus.yml scrapes it). A memory or disk alarm blocks every publish: the journal then keeps its entries in the database (Events the journal does not protect), and dead letters wait in the outbox.",
				queries: []query{
					{alarm("rabbitmq_alarms_memory_used_watermark"), "{{rabbitmq_cluster}} memory"},
					{alarm("rabbitmq_alarms_free_disk_space_watermark"), "{{rabbitmq_cluster}} disk"},
					{alarm("rabbitmq_alarms_file_descriptor_limit"), "{{rabbitmq_cluster}} file descriptors"}}},
			lines{title: "Consumers per queue", unit: "none",
				description: "Consumers attached to each partition queue: one per replica, of which single active consumer lets one take deliveries.",
				queries: []query{{
					`sum by (queue) (rabbitmq_detailed_queue_consumers{` + onBroker + `})`, "{{queue}}"}}},
		}},
	}
}
