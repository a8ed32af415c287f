package journal

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// The lanes' writes go to the stream through one writer: what several
// lanes wrote while the last publish was on its way goes in one message of
// the stream, and one confirm answers them all. The broker's work is per
// message, not per byte, so with many queues at one event per transaction
// this is what the journal costs the broker most (BENCHMARKS.md, "The
// journal"). Each lane still writes one write at a time, in the order of
// its commits, so a queue's entries keep their order in the stream.

// writeReq is one lane's write: queue's messages, and where its answer
// goes.
type writeReq struct {
	queue    string
	msgs     []event.Spilled
	deadline time.Time // how long its lane waits for the answer; zero for ever
	done     chan error
}

// maxCombined is how many lanes' writes one publish round takes at most.
const maxCombined = 64

// write publishes msgs, queue's journal messages, in order, and returns
// once the broker confirmed each, or ctx ended; at once while the broker
// blocks the journal's publishes.
func (j *Journal) write(ctx context.Context, queue string, msgs []event.Spilled) error {
	if len(msgs) == 0 {
		return nil
	}
	if j.isBlocked() {
		return fmt.Errorf("journal %s: %w", j.cfg.Stream, errBlocked)
	}
	j.startOnce.Do(func() {
		j.writes, j.quit = make(chan *writeReq, maxCombined), make(chan struct{})
		go j.writer()
	})
	req := &writeReq{queue: queue, msgs: msgs, done: make(chan error, 1)}
	req.deadline, _ = ctx.Deadline()
	select {
	case j.writes <- req:
	case <-ctx.Done():
		return fmt.Errorf("journal %s: %w", j.cfg.Stream, ctx.Err())
	case <-j.quit:
		return fmt.Errorf("journal %s: closed", j.cfg.Stream)
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		// The writer answers it later; the lane tries again or keeps
		// its entries meanwhile, and a copy of them may reach the stream.
		return fmt.Errorf("journal %s: confirm: %w", j.cfg.Stream, ctx.Err())
	}
}

func (j *Journal) stopWriter() {
	j.startOnce.Do(func() {}) // a journal that never wrote starts no writer now
	j.quitOnce.Do(func() {
		if j.quit != nil {
			close(j.quit)
		}
	})
}

// writer publishes the lanes' writes until the journal closes: each round
// takes the writes waiting, up to maxCombined, and answers each with the
// round's outcome.
func (j *Journal) writer() {
	for {
		var round []*writeReq
		select {
		case req := <-j.writes:
			round = append(round, req)
		case <-j.quit:
			return
		}
	more:
		for len(round) < maxCombined {
			select {
			case req := <-j.writes:
				round = append(round, req)
			default:
				break more
			}
		}
		err := j.publishRound(round)
		for _, req := range round {
			req.done <- err
		}
	}
}

// publishRound publishes round's messages, combined, and waits for every
// answer, for as long as the last of its lanes waits (for ever when one
// waits for ever).
func (j *Journal) publishRound(round []*writeReq) error {
	ctx := context.Background()
	var latest time.Time
	for _, req := range round {
		if req.deadline.IsZero() {
			latest = time.Time{}
			break
		}
		if req.deadline.After(latest) {
			latest = req.deadline
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	if j.isBlocked() {
		return fmt.Errorf("journal %s: %w", j.cfg.Stream, errBlocked)
	}
	ch, ans, err := j.channel()
	if err != nil {
		return err
	}
	msgs, err := combine(round, time.Now())
	if err != nil {
		return fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	answers := make([]<-chan error, len(msgs))
	for i, m := range msgs {
		if answers[i], err = j.publish(ctx, ch, ans, m); err != nil {
			j.fail(ch)
			return fmt.Errorf("journal %s: publish: %w", j.cfg.Stream, err)
		}
	}
	for _, a := range answers {
		if err := j.answer(ctx, ch, a); err != nil {
			return err
		}
	}
	return nil
}

// part is one queue's journal message, in a round.
type part struct {
	queue string
	msg   event.Spilled
}

// combine makes round's messages into as few stream messages as fit
// maxMessage each: one part alone keeps its own form (publishing), several
// go in one message with hQueues.
func combine(round []*writeReq, now time.Time) ([]amqp.Publishing, error) {
	var out []amqp.Publishing
	var cur []part
	size := 0
	flush := func() error {
		switch len(cur) {
		case 0:
			return nil
		case 1:
			out = append(out, publishing(cur[0].queue, cur[0].msg, now))
		default:
			p, err := combined(cur, now)
			if err != nil {
				return err
			}
			out = append(out, p)
		}
		cur, size = nil, 0
		return nil
	}
	for _, req := range round {
		for _, m := range req.msgs {
			if len(cur) > 0 && size+len(m.Body) > maxMessage {
				if err := flush(); err != nil {
					return nil, err
				}
			}
			cur = append(cur, part{req.queue, m})
			size += len(m.Body) + len(req.queue) + 16
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// combined is one stream message that holds parts, of several queues. Its
// hQueues header is a JSON object, queue to [first, last], in a string: a
// stream keeps a message's headers as AMQP 1.0 application properties,
// which hold no nested table (3.10.8 dropped one).
func combined(parts []part, now time.Time) (amqp.Publishing, error) {
	ranges := map[string][2]int64{}
	body := []byte{'['}
	for i, p := range parts {
		if r, ok := ranges[p.queue]; ok {
			ranges[p.queue] = [2]int64{r[0], p.msg.Last}
		} else {
			ranges[p.queue] = [2]int64{p.msg.First, p.msg.Last}
		}
		q, err := json.Marshal(p.queue)
		if err != nil {
			return amqp.Publishing{}, err
		}
		if i > 0 {
			body = append(body, ',')
		}
		body = append(append(append(append(body, `{"q":`...), q...), `,"e":`...), p.msg.Body...)
		body = append(body, '}')
	}
	body = append(body, ']')
	r, err := json.Marshal(ranges)
	if err != nil {
		return amqp.Publishing{}, err
	}
	return amqp.Publishing{
		Headers:     amqp.Table{hQueues: string(r)},
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: now,
		Body: body,
	}, nil
}
