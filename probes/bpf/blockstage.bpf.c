// SPDX-License-Identifier: GPL-2.0
/* Where the time of a block request goes, timed once, where it completes (probes/blockstage.py loads it).
 *
 * A blk-mq request carries its own times: start_time_ns (stamped when it was allocated, on every queue that
 * keeps I/O statistics or has a scheduler) and io_start_time_ns (stamped when the driver took it, on queues
 * with QUEUE_FLAG_STATS: writeback throttling, blk-iolatency, iocost). At completion both stages fall out of
 * them with no start map: queue = issue - alloc, device = now - issue, total = now - alloc. A disk whose
 * requests come without an issue time is timed from a map the issue program fills, keyed by the request
 * (an LRU map: a request that never completes is forgotten, not leaked); the issue program does nothing
 * on a disk that stamps its requests. Which path each disk is on is in its `disks` entry.
 *
 * Per I/O on a stamped disk: one lookup of the disk, one per-CPU histogram count and one per-CPU sum when the
 * request spent no time in the queue (STAGE_UNQUEUED), three of each when it did.
 * Disks not in `disks` (filled by the loader) cost one lookup. Counts are cumulative, read by the loader.
 *
 * Per service: each timed request's total time is also counted under the cgroup it was charged to (the blkcg of
 * its bio, which for page-cache writeback on cgroup v2 is the cgroup that dirtied the pages), per disk, in a slot
 * of `cgvals` (shared by the CPUs: three atomic adds). Which slot a (cgroup, disk) has is in `cgslot`, a hash the
 * program looks in only when the request is not of the pair this CPU counted last (`cglast`): a hash lookup costs
 * some 50 ns a request, the array's none. Slots are bounded ([tracer] max_cgroups); once all are taken a new pair
 * counts in its disk's own slot (slot = the disk's index: its "other"), so the cost and memory are the same with
 * five cgroups or five thousand. The loader frees the slots of idle pairs (`cgfree`) and bumps `cggen`, which
 * every CPU's cached pair must match.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#define SUB_BITS 3              /* probes/blocktrace.py: eight buckets per octave of nanoseconds */
#define SAMPLE_SCALE 1024
#define REQ_OP_BITS 8
#define OP_READ 0
#define OP_WRITE 1
#define PATH_STAMPED 1          /* the request's own io_start_time_ns */
#define PATH_ISSUE_MAP 2        /* the issue program's map */
#define STAGE_UNQUEUED 3        /* device = total, queue 0: one count where three would be */
#define SLOTS_PER_DISK 8        /* sums: two directions of four stages (the three and STAGE_UNQUEUED) */
#define CG_FIRST_OCTAVE 10      /* a cgroup's histogram: eighth-octaves of nanoseconds from 2^10 (1 us)... */
#define CG_BUCKETS (32 << SUB_BITS)     /* ...to 2^42 (73 min), a power of two; a time outside: an end bucket */

/* Set by the loader before the load, read-only once loaded: the verifier drops the branches they rule out, so
 * the usual path pays nothing for them. The object's only read-only data: the loader writes it whole. */
const volatile struct options {
	/* --issue-map: every disk timed from the issue program's map, as a queue that does not stamp its requests
	 * would be; how that path is tested on a kernel whose queues all stamp */
	__u32 ignore_stamp;
	/* 0: no count per cgroup ([tracer] per_cgroup = false; the bench's "without cgroups") */
	__u32 by_cgroup;
	/* cgvals' slots: the disks' own (their other), then one per (cgroup, disk) pair */
	__u32 slots;
} options = {.ignore_stamp = 0, .by_cgroup = 1, .slots = 1024};

struct disk {
	__u32 index;            /* the disk's place in `sums` (loader-assigned, < max_disks) */
	__u32 skip;             /* of SAMPLE_SCALE: requests not timed (0: every one) */
	__u32 path;             /* PATH_*: the last completion's */
	__u32 pad;
};

struct hkey {
	__u32 dev;              /* the kernel's dev_t: major << 20 | minor */
	__u8 dir;               /* 0 read, 1 write */
	__u8 stage;             /* 0 queue, 1 device, 2 total */
	__u16 bucket;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);          /* set by the loader to the disks traced */
	__type(key, __u32);
	__type(value, struct disk);
} disks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct hkey);
	__type(value, __u64);
} lat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4096 * SLOTS_PER_DISK);   /* disk index * 8 + dir * 4 + stage: nanoseconds summed */
	__type(key, __u32);
	__type(value, __u64);
} sums SEC(".maps");

struct cgkey {
	__u64 cgroup;           /* the cgroup's id (its directory's inode number on the blkio or unified hierarchy);
	                         * 0: a request with no cgroup (no bio, or the kernel keeps none) */
	__u32 dev;
	__u32 pad;
};

struct cgdir {
	__u64 bytes;
	__u64 ns;               /* total time, summed */
	__u32 buckets[CG_BUCKETS];
};

struct cgval {
	struct cgdir dir[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);          /* set by the loader: a slot per disk (its other), then [tracer] max_cgroups */
	__type(key, __u32);
	__type(value, struct cgval);
} cgvals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);          /* set by the loader: [tracer] max_cgroups */
	__type(key, struct cgkey);
	__type(value, __u32);               /* its slot in cgvals */
} cgslot SEC(".maps");

struct cglast {
	struct cgkey key;
	__u32 slot;
	__u32 gen;              /* cgstate.gen when cached: a slot freed since is not used, nor a "no room" kept */
	__u32 valid;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cglast);
} cglast SEC(".maps");

struct cgstate {
	__u32 gen;              /* bumped by the loader each time it frees slots */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cgstate);
} cgstate SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 1024);          /* set by the loader: [tracer] max_cgroups */
	__type(value, __u32);               /* free slots: all but the disks' at the start, then those the loader freed */
} cgfree SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);                 /* the request's address */
	__type(value, __u64);               /* when the driver took it */
} issued SEC(".maps");

static __always_inline __u32 bucket_of(__u64 v)
{
	__u64 x = v;
	__u32 o = 0;

	if (x >= 1ULL << 32) { o += 32; x >>= 32; }
	if (x >= 1ULL << 16) { o += 16; x >>= 16; }
	if (x >= 1ULL << 8) { o += 8; x >>= 8; }
	if (x >= 1ULL << 4) { o += 4; x >>= 4; }
	if (x >= 1ULL << 2) { o += 2; x >>= 2; }
	if (x >= 1ULL << 1) { o += 1; }
	if (o < SUB_BITS)
		return o << SUB_BITS;
	return (o << SUB_BITS) + ((v >> (o - SUB_BITS)) & ((1 << SUB_BITS) - 1));
}

static __always_inline void count(__u32 dev, __u32 index, __u8 dir, __u8 stage, __u64 ns)
{
	struct hkey k = {.dev = dev, .dir = dir, .stage = stage, .bucket = bucket_of(ns)};
	__u64 *c = bpf_map_lookup_elem(&lat, &k);
	__u32 slot = index * SLOTS_PER_DISK + dir * 4 + stage;
	__u64 *s;

	if (c) {
		*c += 1;
	} else {
		__u64 one = 1;
		bpf_map_update_elem(&lat, &k, &one, BPF_NOEXIST);
	}
	s = bpf_map_lookup_elem(&sums, &slot);
	if (s)
		*s += ns;
}

/* before 5.16 a request named its disk itself (rq_disk); since then its queue does */
struct request___rq_disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline __u32 dev_of(struct request *rq)
{
	struct gendisk *disk;

	if (bpf_core_field_exists(((struct request_queue *)0)->disk)) {
		disk = rq->q->disk;     /* a typed pointer (tp_btf): read directly, no helper call */
		if (!disk)
			return 0;
		return ((__u32)disk->major << 20) | (__u32)disk->first_minor;
	}
	disk = BPF_CORE_READ((struct request___rq_disk *)rq, rq_disk);
	if (!disk)
		return 0;
	return ((__u32)BPF_CORE_READ(disk, major) << 20) | (__u32)BPF_CORE_READ(disk, first_minor);
}

/* the cgroup a request was charged to: its first bio's blkcg (every bio of a request is of one blkcg). Typed
 * pointers (tp_btf) read directly: five loads, no helper call (BPF_CORE_READ's five probe reads cost some 150 ns) */
static __always_inline __u64 cgroup_of(struct request *rq)
{
	struct bio *bio = rq->bio;
	struct blkcg_gq *blkg;
	struct blkcg *blkcg;
	struct cgroup *cg;

	if (!bio || !bpf_core_field_exists(bio->bi_blkg))
		return 0;
	blkg = bio->bi_blkg;
	if (!blkg)
		return 0;
	blkcg = blkg->blkcg;
	if (!blkcg)
		return 0;
	cg = blkcg->css.cgroup;
	if (!cg || !cg->kn)
		return 0;
	return cg->kn->id;
}

/* the slot of the request's (cgroup, disk): this CPU's last if it is the same pair, else the hash's, else a free one,
 * else the disk's own (its other) */
static __always_inline __u32 slot_of(__u64 cgroup, __u32 dev, __u32 disk_index)
{
	struct cgkey k = {.cgroup = cgroup, .dev = dev};
	__u32 zero = 0, slot, *found;
	struct cglast *last = bpf_map_lookup_elem(&cglast, &zero);
	struct cgstate *st = bpf_map_lookup_elem(&cgstate, &zero);

	if (!last || !st)
		return disk_index;
	if (last->valid && last->key.cgroup == cgroup && last->key.dev == dev && last->gen == st->gen)
		return last->slot;
	found = bpf_map_lookup_elem(&cgslot, &k);
	if (found) {
		slot = *found;
	} else {
		if (bpf_map_pop_elem(&cgfree, &slot) != 0 || slot >= options.slots)
			slot = disk_index;  /* no room: the disk's own, until the loader frees slots (and bumps gen) */
		else if (bpf_map_update_elem(&cgslot, &k, &slot, BPF_NOEXIST) != 0) {
			/* another CPU made the pair first: its slot is used, this one goes back */
			bpf_map_push_elem(&cgfree, &slot, 0);
			found = bpf_map_lookup_elem(&cgslot, &k);
			if (!found)
				return disk_index;
			slot = *found;
		}
	}
	last->key = k;
	last->slot = slot;
	last->gen = st->gen;
	last->valid = 1;
	return slot;
}

static __always_inline struct cgval *cgval_of(struct request *rq, __u32 dev, __u32 disk_index)
{
	__u32 slot = slot_of(cgroup_of(rq), dev, disk_index);

	return bpf_map_lookup_elem(&cgvals, &slot);
}

static __always_inline void count_cgroup(struct request *rq, __u32 dev, __u32 disk_index, __u8 dir, __u64 ns,
					 __u32 nr_bytes)
{
	struct cgval *v = cgval_of(rq, dev, disk_index);
	__u32 b = bucket_of(ns);

	if (!v)
		return;
	b = b < (CG_FIRST_OCTAVE << SUB_BITS) ? 0 : b - (CG_FIRST_OCTAVE << SUB_BITS);
	if (b >= CG_BUCKETS)
		b = CG_BUCKETS - 1;
	/* the bound again as a mask the compiler must keep (barrier_var): 6.1's verifier lost the two above in the
	 * compiled code (an offset of unknown sign, "misaligned access") and refused the program */
	barrier_var(b);
	b &= CG_BUCKETS - 1;
	dir &= 1;
	/* three adds: the request count is the buckets' sum (the loader adds them up) */
	__sync_fetch_and_add(&v->dir[dir].bytes, nr_bytes);
	__sync_fetch_and_add(&v->dir[dir].ns, ns);
	__sync_fetch_and_add(&v->dir[dir].buckets[b], 1);
}

/* RQF_FLUSH_SEQ: bit 4 of rq_flags while the flags were #defines, a bit numbered by enum rqf_flags since (a local
 * flavour of that enum: libbpf matches it by name, so the object builds on a machine whose headers have either) */
enum rqf_flags___iowarden { __RQF_FLUSH_SEQ___iowarden = 1 };

static __always_inline __u32 flush_seq_flag(void)
{
	if (bpf_core_enum_value_exists(enum rqf_flags___iowarden, __RQF_FLUSH_SEQ___iowarden))
		return 1U << bpf_core_enum_value(enum rqf_flags___iowarden, __RQF_FLUSH_SEQ___iowarden);
	return 1U << 4;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(on_issue, struct request *rq)
{
	__u32 dev = dev_of(rq);
	struct disk *d = bpf_map_lookup_elem(&disks, &dev);
	__u64 key = (__u64)rq, now;

	if (!d || (d->path == PATH_STAMPED && !options.ignore_stamp))
		return 0;
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&issued, &key, &now, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(on_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	__u32 dev = dev_of(rq);
	struct disk *d = bpf_map_lookup_elem(&disks, &dev);
	__u64 now, alloc, issue, key = (__u64)rq, *mapped;
	__u32 op;
	__u8 dir;

	if (!d)
		return 0;
	op = rq->cmd_flags & ((1 << REQ_OP_BITS) - 1);
	if (op != OP_READ && op != OP_WRITE)
		return 0;               /* flush, discard, zone commands: not timed */
	if (d->skip && bpf_get_prandom_u32() % SAMPLE_SCALE < d->skip)
		return 0;
	dir = op == OP_WRITE;
	if (rq->rq_flags & flush_seq_flag()) {
		/* a step of a flush sequence (block/blk-flush.c): the data of a write with PREFLUSH or FUA (a journal's
		 * commit) is done, its flushes are not. The request completes again, with no bytes left, once they are:
		 * that completion is the one /proc/diskstats counts and the writer waits for, so it is the one timed.
		 * Timed at both, each such write counts twice (fio's fdatasync appender growing a file on XFS: 897
		 * writes where diskstats counts 598). Its bytes are only known here */
		if (options.by_cgroup && nr_bytes) {
			struct cgval *v = cgval_of(rq, dev, d->index);

			if (v)
				__sync_fetch_and_add(&v->dir[dir & 1].bytes, nr_bytes);
		}
		return 0;
	}
	now = bpf_ktime_get_ns();
	alloc = rq->start_time_ns;
	issue = options.ignore_stamp ? 0 : rq->io_start_time_ns;
	if (issue) {
		if (d->path != PATH_STAMPED)
			d->path = PATH_STAMPED;
	} else {
		mapped = bpf_map_lookup_elem(&issued, &key);
		if (!mapped && !nr_bytes) {
			/* a request no driver took: an empty PREFLUSH write (an fsync's cache flush), done for it by the
			 * queue's own flush request, whose op this program does not time. /proc/diskstats counts it as a
			 * write of no sectors, and the fsync waits all its life, so it is timed from its allocation, all of
			 * it the device's (no stage of its own was queued). It says nothing of how this disk times its
			 * requests: the path stays (taken for a disk without stamps, it would attach the issue program to a
			 * disk that stamps every request, and the journal would say the disk does not stamp) */
			if (!alloc || alloc > now)
				return 0;
			if (options.by_cgroup)
				count_cgroup(rq, dev, d->index, dir, now - alloc, 0);
			count(dev, d->index, dir, STAGE_UNQUEUED, now - alloc);
			return 0;
		}
		if (!mapped) {
			if (d->path != PATH_ISSUE_MAP)
				d->path = PATH_ISSUE_MAP;   /* the issue program keeps times from now on */
			return 0;
		}
		issue = *mapped;
		bpf_map_delete_elem(&issued, &key);
		if (d->path != PATH_ISSUE_MAP)
			d->path = PATH_ISSUE_MAP;
	}
	if (issue > now)
		return 0;
	if (options.by_cgroup)
		count_cgroup(rq, dev, d->index, dir, alloc && alloc <= issue ? now - alloc : now - issue, nr_bytes);
	if (alloc == issue) {
		/* no time in the queue (most requests: allocated and issued in one plug, whose time the kernel
		 * reads once): one count for the three stages, which the loader spreads (STAGE_UNQUEUED) */
		count(dev, d->index, dir, STAGE_UNQUEUED, now - issue);
		return 0;
	}
	count(dev, d->index, dir, 1, now - issue);
	if (alloc && alloc < issue) {
		count(dev, d->index, dir, 0, issue - alloc);
		count(dev, d->index, dir, 2, now - alloc);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
