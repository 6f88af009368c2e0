--[[ complete: finish active jobs with their results, fenced by lease tokens.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] n
  then per job 4 values: id, lease token, result (serialised), result_ttl_ms (0: drop the
  record now, -1: keep forever)
  Returns {code_1, ..., code_n}: 1 ok (also when this token already completed the job: an ack
  resent after a lost reply), 2 ok and its outcome waits in this queue's outbox for a batch on
  another queue, -1 no such job, -2 lease token mismatch or job not active ]]
return do_complete(3, tonumber(ARGV[2]), now_ms())
